//! Executables for models with dynamic sizes: a batch run as copies of one executable
//! compiled at batch 1 (or compiled for a few sizes, a run split into chunks of those), a
//! sequence length padded to buckets, image sizes padded to buckets or compiled exactly,
//! in bounded caches.
//!
//! An ONNX model whose inputs have a dynamic leading dimension (`batch`, `N`, `-1`) can
//! be run at any batch without recompiling for each one. [`DynamicExecutable`] keeps the
//! model's path and options and compiles *buckets*: the model with its batch pinned,
//! batch 1 first.
//!
//! ## The batch as a run-time extent: copies of batch 1
//!
//! Where the model computes each element of the batch on its own (proved by
//! [`smelt_ir::batch::batch_axes`] on the model at batch 2, as for a split into chunks
//! of 1), a run of `n` elements runs bucket 1's executable as `n` *copies*
//! ([`DynamicOptions::batch_copies`], the default): every kernel that touches the batch
//! is called once per element, its batched buffers moved one element on (the caller's
//! input and result slices hold the elements one after another; the workspace holds one
//! arena per copy, laid out alike), the kernels that do not touch it once. So the batch
//! is an extent chosen at run time, the bounds proof of each kernel holds for each copy
//! by translation, and no other size is ever compiled: a new batch size costs no compile
//! at all. The copies of one kernel run back to back, so its weights stay in cache from
//! one element to the next. With threads, when every step touches the batch (a CNN's
//! do), each copy runs whole on one thread and the copies are shared between the
//! threads as they finish (no barrier between steps, one element's data per core, and
//! where every batched result is written in place one arena per thread, each reused by
//! that thread's next copy, so the whole batch is one run); otherwise one pool
//! job per kernel spreads every copy's trips over them (the batch as one more parallel
//! dimension). Measured on this VM (same
//! process, alternating, 1 thread): MobileNetV3-small 0.96–1.04× the buckets' time at
//! batches 2 to 8, ResNet-50 1.00–1.06× the chunked buckets and 0.78–0.90× an
//! executable specialized for batch 8 (which outgrows the cache).
//!
//! ## Buckets
//!
//! With `batch_copies` off, or for a model whose elements read each other, a bucket is
//! the model with its batch pinned to a power of two up to
//! [`DynamicOptions::max_bucket`]. A run of `n` elements is split into chunks of bucket
//! sizes, largest first, no chunk larger than the *largest chunk* (below); each chunk's
//! inputs are contiguous ranges of the caller's tensors and its outputs are written
//! straight into ranges of the results, so nothing is copied and nothing is padded. A
//! batch equal to a bucket no larger than the largest chunk is one run of it.
//!
//! The largest chunk is the batch as a blocking dimension of the whole graph: a bucket
//! (or a run of copies) runs layer by layer over its whole batch, so once a layer's
//! activations for all its elements outgrow the last-level cache every layer streams
//! them from memory. It is the largest bucket whose arena, estimated as its size times
//! bucket 1's, fits the cache ([`DynamicOptions::cache_bytes`], by default the CPU's
//! last-level cache): ResNet-50 at 224² (9 MB per element) runs in chunks of 2 on a
//! 32 MiB L3, MobileNetV3 (2.3 MB) in chunks of 8. Bucket 1 is compiled first, since
//! its arena decides. Runs of copies are chunked the same way, unless they run whole in
//! one arena per thread (above): those touch the same memory whatever their length.
//!
//! ## Fused once
//!
//! The first compile imports the model once with its dynamic sizes as symbols
//! ([`crate::onnx::import_file_symbolic`]: `Nx3x224x224`, `1x3x(32*"height/32")x…`) and
//! runs the pass pipeline on it once; every bucket, image size and exact length then
//! specializes that module at its sizes and only lowers and generates code, and its
//! proofs (below) read the symbolic import specialized the same way. Fusion's decisions
//! hold for every value of the symbols (its guards compare sizes symbolically), and an
//! input that no value of a symbol fits is refused naming the input and the dimension
//! (unless the model imports at exactly those sizes after all: that bucket then imports
//! and fuses on its own).
//! A model whose import depends on a size otherwise (a constant the importer folds from
//! the sequence length, as in a BERT's position ids), or a pipeline with a pass that
//! needs known sizes, imports and optimizes each bucket at its own sizes instead.
//! [`DynamicExecutable::shared_module`] says which, and why. The symbolic import and
//! fusion take 14–24 ms once for MobileNetV3-large (21–30 ms for ResNet-50), and each
//! bucket then skips an import and a fusion of its own (≈ 9 + 8 ms for
//! MobileNetV3-large): what is left of a bucket's compile is lowering and code
//! generation.
//!
//! Splitting is exact only when the model computes each batch element on its own. That
//! is proved by [`smelt_ir::batch::batch_axes`] on each bucket of 2 or more as it is
//! compiled, on the module that bucket compiles; a split takes the largest bucket of its
//! chunks as its proof (bucket 1 has no batch to follow: a split into chunks of 1 is
//! proved once on the model loaded, not compiled, at batch 2). A model
//! that mixes batch elements (a reduction along the batch, a reshape moving it into
//! features) still runs every bucket size as one chunk, and any other batch gets an
//! error naming the op that mixes.
//!
//! Policy, stated and observable: with batch copies one specialization (bucket 1) serves
//! every batch; otherwise at most `log2(max_bucket) + 1` specializations exist (4 with
//! the default `max_bucket` of 8), and none above the largest chunk; each is compiled on
//! the first run that needs it and kept for the executable's life
//! ([`DynamicExecutable::specializations`] lists them and whether bucket 1 runs copies,
//! [`DynamicExecutable::chunk_plan`] says how a batch
//! will run). Compiles of different buckets may run at once on
//! different threads; two runs needing the same uncompiled bucket wait for one compile.
//! [`DynamicExecutable::warm_up`] compiles the buckets a batch needs ahead of time.
//!
//! ## A sequence length
//!
//! A model may also have one symbolic dimension off the leading axis, shared by its
//! inputs — a BERT's `[batch, sequence]` token ids, attention mask and token types. A
//! run of length `S` pads its inputs with zeros along that dimension to the smallest
//! *length bucket* `P ≥ S` (16, 32, 64, 128, 192, 256, 384, 512, 768, ... up to
//! [`DynamicOptions::max_sequence`]), runs the bucket compiled at `P` and keeps the
//! first `S` positions of each result along its sequence axes. That is exact when
//! [`smelt_ir::padding::padding_proof`] proves, on the model imported at `P` and at the
//! shortest length the bucket serves, that no valid position of a result reads a padded
//! one (an attention mask makes a padded key weigh 0) and that whatever the importer
//! folded from the length agrees on the valid prefix; a bucket it refuses is an error
//! naming the op. A length equal to a bucket runs without copies.
//!
//! A sweep over lengths 1 to 384 compiles at most 7 specializations (at batch 1). With a
//! sequence, a batch runs as copies of the length bucket's batch-1 executable (each copy
//! padded as a batch-1 run is, so the proof made at batch 1 holds for each), or one
//! element at a time with `batch_copies` off.
//!
//! ## Image sizes: padded to buckets, or compiled exactly
//!
//! Padding as for a sequence is not exact along an image's height and width: convs and
//! pools read across the border, and after the first conv's bias and activation the
//! padded border holds values the next conv's windows read into valid pixels. So a model
//! with two or more named symbols off the leading axis (a detector's
//! `[1, 3, height, width]`; [`DynamicExecutable::symbols`], [`DynamicDim::Symbol`]) and
//! no batch or sequence runs each size padded to an *image bucket* (each side rounded up
//! on the ladder of [`image_bucket`], `m·2^e` for `m` in 4..=7: less than a quarter more
//! per side), the model prepared once by [`smelt_ir::symbolic::pad_images`]: every value
//! a window op reads across its border is multiplied by a mask input (1 on the run's
//! real extent, 0 past it) and every global average pool of one rescaled, so each window
//! reads the zeros its own padding would. The results are cropped to the real sizes.
//! One compile serves every size of a bucket: DBNet at 608×480 and 640×480 both run its
//! 640×512 bucket, the second size's first run ≈ 50 ms (no compile) against ≈ 160 ms for
//! an exact compile, each run ≈ 5–8% slower than an exact executable (the extra rows),
//! within 2e-7 of it. The buckets' inputs and results are kept between runs (fresh
//! memory costs page clearing per run). See `images.rs` for the policy.
//!
//! Sizes compile exactly instead — each distinct set of values its own executable — for
//! a model `pad_images` refuses (a bilinear resize to the input's size, a max pool with
//! padding), for sizes no bucket of the ladder can take, with
//! [`DynamicOptions::image_buckets`] `false`, and for a model whose one symbol the
//! sequence padding proof refuses (a text-line recognizer's width, read by its convs):
//! its first refused bucket turns the length into such a symbol, and every run after that
//! compiles its length exactly, the refusal kept as a warning of each specialization.
//! Inputs that share a symbol must agree on its value (an error names both). The batch,
//! if dynamic too, is still bucketed within each set of sizes.
//!
//! Policy: at most [`DynamicOptions::max_shapes`] image buckets and, apart, as many sets
//! of exact sizes (default 8 each) keep their executables, the least recently run dropped
//! first; a run at a new one compiles on the spot (DBNet at 640×480: ≈ 95 ms).

mod images;

pub use images::image_bucket;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use smelt_ir::batch::{batch_axes, leading_results, BatchAxis, ElementGather};
use smelt_ir::padding::{padded_rows, padding_proof, NOT_PADDABLE};
use smelt_ir::symbolic::specialize;
use smelt_ir::{DType, Diagnostic, Severity, Tensor, TensorType};

use crate::driver::{optimize, Options};
use crate::onnx::{
    declared_interface, decode_file, try_import_symbolic, DecodedModel, ImportOptions, InputDim,
};
use crate::runtime::{copy_common_box, Elements, ElementsMut, Executable, KernelProfile};
use crate::Error;
use smelt_passes::lower::ConstantCache;

/// The largest bucket [`DynamicOptions::max_bucket`] may name.
pub const MAX_BUCKET_LIMIT: usize = 1024;

/// The most sets of sizes [`DynamicOptions::max_shapes`] may keep: each holds compiled
/// code and packed weights.
pub const MAX_SHAPES_LIMIT: usize = 256;

/// How a [`DynamicExecutable`] specializes.
#[derive(Clone, Copy, Debug)]
pub struct DynamicOptions {
    /// The largest batch compiled as one executable (buckets) or run as one run of
    /// copies of bucket 1 ([`DynamicOptions::batch_copies`]), a power of two of at least
    /// 2 (default 8); larger batches run as several chunks.
    pub max_bucket: usize,
    /// The cache a chunk's run-time memory should fit, in bytes: a batch is split into
    /// chunks no larger than the largest bucket whose arena, estimated as its size times
    /// bucket 1's arena, fits it. `None` (default): the size of the CPU's last-level
    /// cache as the OS reports it, 32 MiB where it reports none.
    pub cache_bytes: Option<u64>,
    /// For a model with a symbolic sequence length: the longest length a run may have
    /// (default 512); the length buckets are those of [`sequence_buckets`] up to it.
    pub max_sequence: usize,
    /// For a model with two or more symbols off the leading axis (an image's height and
    /// width): how many image buckets, and how many distinct sets of values compiled
    /// exactly, keep their executables (default 8 each, at most [`MAX_SHAPES_LIMIT`]); a
    /// run of a new one past that drops the least recently run one's.
    pub max_shapes: usize,
    /// For a model with image sizes (two or more symbols off the leading axis, no batch
    /// or sequence): run each size padded to an image bucket ([`image_bucket`]'s ladder)
    /// where the model allows it, one compile per bucket (default `true`); `false`
    /// compiles each set of sizes exactly.
    pub image_buckets: bool,
    /// For a model with a batch and no sequence: run every batch as copies of bucket 1,
    /// each kernel touching the batch called once per element with its batched buffers
    /// moved one element on (default `true`) — one compile for every batch size, the
    /// batch a run-time extent — where the model computes each element on its own;
    /// `false` compiles a bucket per power of two as the batch needs them.
    pub batch_copies: bool,
}

impl Default for DynamicOptions {
    fn default() -> Self {
        DynamicOptions {
            max_bucket: 8,
            cache_bytes: None,
            max_sequence: 512,
            max_shapes: 8,
            image_buckets: true,
            batch_copies: true,
        }
    }
}

/// The length buckets up to `max` (at least 1): 16, 32, 64, 128, then steps of half the
/// last power of two (192, 256, 384, 512, 768, 1024, ...), the last one `max` itself.
/// A run pads at most to twice its length below 128 and to 1.5 times above.
pub fn sequence_buckets(max: usize) -> Vec<usize> {
    let mut ladder = Vec::new();
    let mut next = 16usize;
    while next < max {
        ladder.push(next);
        next = match next {
            n if n < 128 => n * 2,
            n if n.is_power_of_two() => n + n / 2,
            n => n / 3 * 4,
        };
    }
    ladder.push(max.max(1));
    ladder
}

/// The last-level cache assumed where the OS reports none.
const DEFAULT_CACHE_BYTES: u64 = 32 << 20;

/// The size of the CPU's last-level cache, as Linux reports it for CPU 0
/// (`/sys/devices/system/cpu/cpu0/cache/index*/{level,size}`), or `None`.
fn last_level_cache_bytes() -> Option<u64> {
    let base = Path::new("/sys/devices/system/cpu/cpu0/cache");
    let read = |index: usize, file: &str| {
        std::fs::read_to_string(base.join(format!("index{index}")).join(file)).ok()
    };
    (0..8)
        .filter_map(|i| {
            let level: u32 = read(i, "level")?.trim().parse().ok()?;
            let size = read(i, "size")?;
            let size = size.trim();
            let (digits, unit) = match size.strip_suffix('K') {
                Some(d) => (d, 1 << 10),
                None => match size.strip_suffix('M') {
                    Some(d) => (d, 1 << 20),
                    None => (size, 1),
                },
            };
            Some((level, digits.parse::<u64>().ok()?.checked_mul(unit)?))
        })
        .max()
        .map(|(_, bytes)| bytes)
}

/// One dimension of an input of a [`DynamicExecutable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DynamicDim {
    /// A fixed size.
    Fixed(usize),
    /// The batch: a leading dynamic dimension.
    Batch,
    /// The sequence length: the one symbolic dimension off the leading axis.
    Sequence,
    /// One of two or more named symbols off the leading axis (an image's height and
    /// width): each distinct set of their values gets executables of its own, compiled
    /// for exactly those sizes (the index is into [`DynamicExecutable::symbols`]).
    Symbol(usize),
}

/// One input as a [`DynamicExecutable`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicInput {
    /// The input's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its dims.
    pub dims: Vec<DynamicDim>,
    /// The names of the symbols its [`DynamicDim::Symbol`]s index (the executable's
    /// [`DynamicExecutable::symbols`]; empty when it has none).
    pub symbol_names: Vec<String>,
}

impl DynamicInput {
    /// The shape as text, the batch written `N`, the sequence `S` and other symbols by
    /// name: `Nx3x224x224`, `1x3xheightxwidth`.
    pub fn shape_text(&self) -> String {
        let parts: Vec<String> = self
            .dims
            .iter()
            .map(|d| match d {
                DynamicDim::Fixed(n) => n.to_string(),
                DynamicDim::Batch => "N".to_string(),
                DynamicDim::Sequence => "S".to_string(),
                DynamicDim::Symbol(k) => self
                    .symbol_names
                    .get(*k)
                    .cloned()
                    .unwrap_or_else(|| format!("?{k}")),
            })
            .collect();
        parts.join("x")
    }

    fn batched(&self) -> bool {
        self.dims.first() == Some(&DynamicDim::Batch)
    }

    fn sequenced(&self) -> bool {
        self.dims.contains(&DynamicDim::Sequence)
    }

    fn symbolic(&self) -> bool {
        self.dims.iter().any(|d| matches!(d, DynamicDim::Symbol(_)))
    }

    /// The concrete dims at batch `n` and sequence length `length` (ignored by a model
    /// without a sequence).
    pub fn dims_at(&self, n: usize, length: usize) -> Vec<usize> {
        self.dims
            .iter()
            .map(|d| match *d {
                DynamicDim::Fixed(size) => size,
                DynamicDim::Batch => n,
                DynamicDim::Sequence => length,
                // a symbol is fixed per shaped executable; outside one it has no size
                DynamicDim::Symbol(_) => 0,
            })
            .collect()
    }

    /// The input's row-major type at batch `n` and sequence length `length`.
    pub fn type_at(&self, n: usize, length: usize) -> TensorType {
        TensorType {
            dtype: self.dtype,
            dims: self.dims_at(n, length),
            layout: smelt_ir::Layout::RowMajor,
        }
    }

    /// `data`, this input at batch `n` and sequence `length`, padded with zeros to the
    /// length bucket `bucket`.
    fn padded_to(
        &self,
        data: Elements<'_>,
        n: usize,
        length: usize,
        bucket: usize,
    ) -> Result<Tensor, Error> {
        let mut whole = Tensor::zeros(&self.type_at(n, bucket));
        copy_common_box(
            data,
            &self.dims_at(n, length),
            &mut ElementsMut::of(&mut whole.data),
            &self.dims_at(n, bucket),
        )
        .map_err(|e| Error::InvalidArgument(format!("input {}: {e}", self.name)))?;
        Ok(whole)
    }
}

/// One chunk of a run ([`DynamicExecutable::chunk_plan`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk {
    /// The batch elements it runs.
    pub size: usize,
    /// The batch of the bucket that runs it: `size`, or 1 for a chunk run as copies of
    /// bucket 1.
    pub bucket: usize,
}

impl Chunk {
    /// Whether it runs as copies of a smaller bucket.
    pub fn copies(&self) -> bool {
        self.size != self.bucket
    }
}

/// A specialization compiled so far.
#[derive(Clone, Debug, PartialEq)]
pub struct Specialization {
    /// The batch size it was compiled for.
    pub batch: usize,
    /// The sequence length it was compiled for (a length bucket), for a model with one.
    pub length: Option<usize>,
    /// The values of the symbols it was compiled for, in the order of
    /// [`DynamicExecutable::symbols`]; empty for a model without them.
    pub symbols: Vec<usize>,
    /// Milliseconds the compile took: the model at its sizes (the shared module
    /// specialized, or imported and optimized where there is none, see
    /// [`DynamicExecutable::shared_module`]), lowering and code generation. The shared
    /// module's own time is [`SharedModule::Symbolic`]'s `ms`.
    pub compile_ms: f64,
    /// The warnings of its optimization (a fusion limit hit, an unchecked rule run).
    pub warnings: Vec<Diagnostic>,
    /// For bucket 1 of a model without a sequence, once a batch of 2 or more was
    /// planned: whether it runs any batch as that many copies of itself (every kernel
    /// touching the batch once per element, the batch a run-time extent: see
    /// [`DynamicOptions::batch_copies`]), or why not (the op that mixes elements of the
    /// batch). `None` otherwise.
    pub copies: Option<Result<(), String>>,
    /// For a length bucket serving shorter lengths: whether its products stop at each
    /// run's valid length (the rows past it cleared, not computed; see
    /// [`Executable::padded_rows`]), or why not (the analysis of the optimized model
    /// refused, naming the op). `None` otherwise.
    pub valid_rows: Option<Result<(), String>>,
}

/// A model with a dynamic batch, compiled per bucket on first use (see the module doc).
/// Safe to share across threads.
pub struct DynamicExecutable {
    path: PathBuf,
    options: Options,
    inputs: Vec<DynamicInput>,
    /// The results' names.
    outputs: Vec<String>,
    /// One slot per bucket: batch sizes ascending (1, 2, 4, ... up to `max_bucket`),
    /// each with every length bucket for a model with a sequence.
    buckets: Vec<Bucket>,
    /// The length buckets, ascending, for a model with a sequence; empty otherwise.
    lengths: Vec<usize>,
    /// The names of the symbols specialized exactly ([`DynamicDim::Symbol`]); empty for
    /// a model without them.
    symbols: Vec<String>,
    /// For a model with symbols: one executable per set of symbol values run so far,
    /// the symbols pinned in its inputs, least recently run first, at most
    /// [`DynamicOptions::max_shapes`].
    shaped: Mutex<Vec<(Vec<usize>, Arc<DynamicExecutable>)>>,
    /// The options it was made with, for its shaped executables and their bound.
    dynamic: DynamicOptions,
    /// For a model with a sequence length whose padding the proof refused: the same
    /// model with that length as a symbol compiled exactly per value, which runs every
    /// plan made after the refusal.
    exact_lengths: OnceLock<ExactLengths>,
    /// The name of the sequence length's symbol, for a model with one.
    sequence_name: Option<String>,
    /// The cache a chunk's arena should fit (see [`DynamicOptions::cache_bytes`]).
    cache_bytes: u64,
    /// The batch analysis of the model at batch 2, for splits into chunks of 1 only: one
    /// per length bucket (`None` for a model without a sequence).
    unit_proofs: Mutex<Vec<(Option<usize>, Separability)>>,
    /// The model file decoded once, on the first compile: every bucket imports from it,
    /// so the file is read once and the buckets share its weights.
    decoded: Mutex<Option<Arc<DecodedModel>>>,
    /// The model imported with its dynamic sizes as symbols and optimized once, made on
    /// the first compile and shared with the executables made from this one (image sizes,
    /// exact lengths): each bucket specializes it.
    template: Arc<Mutex<Option<Arc<Template>>>>,
    /// The inputs the caller pinned (`options.load.input_shapes` of the executable
    /// [`DynamicExecutable::new`] made): what the template is imported with, where the
    /// executables made from this one pin more.
    root_pins: BTreeMap<String, Vec<usize>>,
    /// Whether sizes are padded to image buckets: a model whose every dynamic size is an
    /// image side, made by [`DynamicExecutable::new`] with
    /// [`DynamicOptions::image_buckets`].
    pads_images: bool,
    /// The model prepared for padded runs, made on the first run when `pads_images`.
    image_padding: Mutex<Option<Arc<images::ImagePadding>>>,
    /// Whether batches run as copies of bucket 1 (per length bucket, for a model with a
    /// sequence), or why not: decided by the first run of a batch of 2 or more there
    /// ([`DynamicExecutable::runs_copies`]).
    copies: Mutex<BTreeMap<Option<usize>, Result<(), String>>>,
    /// Packed weights, computed by the first bucket that needs them and shared by the
    /// others (and by the executables made from this one): the same panels for any
    /// batch or length, held once.
    constants: Arc<ConstantCache>,
}

/// The model imported once with its dynamic sizes as symbols and run through the pass
/// pipeline once, or why it could not be.
struct Template {
    /// Milliseconds making it took (the symbolic import and the pipeline), or trying to.
    ms: f64,
    modules: Result<TemplateModules, String>,
}

struct TemplateModules {
    /// The symbolic import: specialized, it is the model at a bucket's sizes, the module
    /// a bucket's proofs read.
    imported: smelt_ir::Module,
    /// The import after the pass pipeline: specialized, the module a bucket compiles.
    optimized: smelt_ir::Module,
    /// The pipeline's warnings, which every bucket reports.
    warnings: Vec<Diagnostic>,
}

/// Where the modules of a [`DynamicExecutable`]'s buckets come from.
#[derive(Clone, Debug, PartialEq)]
pub enum SharedModule {
    /// Nothing has been compiled yet.
    Pending,
    /// The model was imported with its dynamic sizes as symbols and optimized once
    /// (taking `ms` milliseconds); each bucket specializes that module at its sizes, so
    /// a new bucket costs lowering and code generation only.
    Symbolic {
        /// Milliseconds the symbolic import and the pass pipeline took.
        ms: f64,
    },
    /// The model could not be kept symbolic (a constant the importer folds from a size,
    /// a pass that needs known sizes): each bucket imports and optimizes the model at its
    /// own sizes.
    PerBucket {
        /// Why, as the symbolic import or the pipeline said.
        reason: String,
        /// Milliseconds trying took.
        ms: f64,
    },
}

/// The value of `key` in `list` (least recently used first), moved last; or, on a miss,
/// the one `make` gives, added last, the oldest entry dropped past `cap` entries.
fn recently_used<K: PartialEq + Clone, V: Clone>(
    list: &mut Vec<(K, V)>,
    key: &K,
    cap: usize,
    make: impl FnOnce() -> Result<V, Error>,
) -> Result<V, Error> {
    let entry = match list.iter().position(|(k, _)| k == key) {
        Some(at) => list.remove(at),
        None => (key.clone(), make()?),
    };
    if list.len() >= cap.max(1) {
        list.remove(0);
    }
    let value = entry.1.clone();
    list.push(entry);
    Ok(value)
}

/// The value in `slot`, made by `make` on first use. The lock is held while it is made,
/// so concurrent callers wait for one make; `what` names the make in the error of a lock
/// a make panicked under.
fn made_once<T>(
    slot: &Mutex<Option<Arc<T>>>,
    what: &str,
    make: impl FnOnce() -> Result<T, Error>,
) -> Result<Arc<T>, Error> {
    let mut slot = slot
        .lock()
        .map_err(|_| Error::Unsupported(format!("{what} panicked")))?;
    if let Some(made) = slot.as_ref() {
        return Ok(made.clone());
    }
    let made = Arc::new(make()?);
    *slot = Some(made.clone());
    Ok(made)
}

/// Which results of a bucket's module carry the batch on their leading axis, or why the
/// module cannot be split.
type Separability = Result<Vec<bool>, Diagnostic>;

/// A sequence length compiled exactly per value, after the padding proof refused it.
struct ExactLengths {
    /// Why the length cannot be padded: the proof's refusal, naming the op.
    refusal: Diagnostic,
    /// The model with the length as its one symbol ([`DynamicDim::Symbol`]).
    exe: Arc<DynamicExecutable>,
}

/// A length bucket's padding: each result's sequence axes, and the shortest length the
/// bucket serves with the model imported at it (`None` when it serves only its own).
type PaddedBucket = (Vec<Vec<usize>>, Option<(usize, smelt_ir::Module)>);

struct Bucket {
    batch: usize,
    length: Option<usize>,
    compiled: Mutex<Option<Arc<Compiled>>>,
}

struct Compiled {
    exe: Arc<Executable>,
    compile_ms: f64,
    /// Floating-point operations of one run of the bucket's model as written.
    flops: u64,
    warnings: Vec<Diagnostic>,
    /// For a bucket of 2 or more: which results carry the batch on their leading axis,
    /// or why its module cannot be split. `None` for bucket 1.
    separable: Option<Separability>,
    /// For a bucket of a sequence length: each result's sequence axes, proved paddable.
    padded: Option<Vec<Vec<usize>>>,
    /// See [`Specialization::valid_rows`].
    valid_rows: Option<Result<(), String>>,
    /// For bucket 1 of a model without a sequence: whether it runs any batch as copies
    /// of itself, or why not. `None` for other buckets.
    copies: Option<Result<(), String>>,
}

impl DynamicExecutable {
    /// Prepares the ONNX model at `path` for runs of any batch: reads its declared
    /// inputs and checks that the dynamic ones are a shared leading batch, without
    /// compiling anything. `options.load.input_shapes` may pin inputs whole (those are
    /// then not batched); every other dynamic dim must be a leading one.
    pub fn new(
        path: &Path,
        options: &Options,
        dynamic: DynamicOptions,
    ) -> Result<DynamicExecutable, Error> {
        let b = dynamic.max_bucket;
        if !b.is_power_of_two() || !(2..=MAX_BUCKET_LIMIT).contains(&b) {
            return Err(Error::InvalidArgument(format!(
                "max_bucket = {} must be a power of two from 2 to {MAX_BUCKET_LIMIT}",
                dynamic.max_bucket
            )));
        }
        let import = ImportOptions {
            input_shapes: options.load.input_shapes.clone(),
            interface: options.load.interface,
            allowed_root: options.load.allowed_root.clone(),
            memory_budget: options.load.memory_budget,
            ..crate::onnx::ImportOptions::default()
        };
        let declared = declared_interface(path, &import)?;
        let mut inputs = Vec::with_capacity(declared.inputs.len());
        let symbols = declared_symbols(
            declared
                .inputs
                .iter()
                .filter(|d| !options.load.input_shapes.contains_key(&d.name))
                .filter_map(|d| d.dims.as_deref()),
        );
        for d in declared.inputs {
            let dims = match options.load.input_shapes.get(&d.name) {
                Some(pinned) => pinned.iter().map(|&n| DynamicDim::Fixed(n)).collect(),
                None => dynamic_dims(&d.name, d.dims.as_deref(), &symbols)?,
            };
            inputs.push(DynamicInput {
                name: d.name,
                dtype: d.dtype,
                dims,
                symbol_names: Vec::new(),
            });
        }
        if !inputs
            .iter()
            .any(|i| i.batched() || i.sequenced() || i.symbolic())
        {
            return Err(Error::InvalidArgument(format!(
                "{}: no input has a dynamic batch (a dynamic leading dimension), sequence \
                 length or other symbol; compile it as an Executable",
                path.display()
            )));
        }
        if !(1..=MAX_SHAPES_LIMIT).contains(&dynamic.max_shapes) {
            return Err(Error::InvalidArgument(format!(
                "max_shapes = {} must be from 1 to {MAX_SHAPES_LIMIT}",
                dynamic.max_shapes
            )));
        }
        let (symbols, sequence_name) = match symbols.len() {
            1 => (Vec::new(), symbols.into_iter().next()),
            _ => (symbols, None),
        };
        let mut exe = Self::assemble(path, options, dynamic, inputs, declared.outputs, symbols)?;
        exe.sequence_name = sequence_name;
        exe.pads_images = dynamic.image_buckets
            && exe.symbols.len() >= 2
            && !exe.inputs.iter().any(|i| i.batched() || i.sequenced());
        Ok(exe)
    }

    /// The executable of `inputs` (dims as [`DynamicExecutable::new`] found them, or with
    /// the symbols pinned for a shaped one), each input's `symbol_names` set from
    /// `symbols`.
    fn assemble(
        path: &Path,
        options: &Options,
        dynamic: DynamicOptions,
        mut inputs: Vec<DynamicInput>,
        outputs: Vec<String>,
        symbols: Vec<String>,
    ) -> Result<DynamicExecutable, Error> {
        for input in &mut inputs {
            input.symbol_names = match input.symbolic() {
                true => symbols.clone(),
                false => Vec::new(),
            };
        }
        let sequenced = inputs.iter().any(DynamicInput::sequenced);
        let lengths = match sequenced {
            true if dynamic.max_sequence == 0 => {
                return Err(Error::InvalidArgument(
                    "max_sequence must be at least 1".into(),
                ))
            }
            true => sequence_buckets(dynamic.max_sequence),
            false => Vec::new(),
        };
        let length_slots: Vec<Option<usize>> = match lengths.is_empty() {
            true => vec![None],
            false => lengths.iter().map(|&l| Some(l)).collect(),
        };
        // with a sequence a batch runs as copies of batch 1, or one element at a time (see
        // the module doc): only batch 1 is ever compiled
        let max_batch = match lengths.is_empty() {
            true => dynamic.max_bucket,
            false => 1,
        };
        let buckets = std::iter::successors(Some(1usize), |&b| Some(b * 2))
            .take_while(|&b| b <= max_batch)
            .flat_map(|batch| {
                length_slots.iter().map(move |&length| Bucket {
                    batch,
                    length,
                    compiled: Mutex::new(None),
                })
            })
            .collect();
        Ok(DynamicExecutable {
            path: path.to_path_buf(),
            options: options.clone(),
            inputs,
            outputs,
            buckets,
            lengths,
            symbols,
            shaped: Mutex::new(Vec::new()),
            dynamic,
            exact_lengths: OnceLock::new(),
            sequence_name: None,
            cache_bytes: dynamic
                .cache_bytes
                .or_else(last_level_cache_bytes)
                .unwrap_or(DEFAULT_CACHE_BYTES),
            unit_proofs: Mutex::new(Vec::new()),
            decoded: Mutex::new(None),
            template: Arc::new(Mutex::new(None)),
            root_pins: options.load.input_shapes.clone(),
            pads_images: false,
            image_padding: Mutex::new(None),
            copies: Mutex::new(BTreeMap::new()),
            constants: Arc::new(ConstantCache::new()),
        })
    }

    /// The inputs, the batch marked.
    pub fn inputs(&self) -> &[DynamicInput] {
        &self.inputs
    }

    /// The batch bucket sizes, ascending.
    pub fn bucket_sizes(&self) -> Vec<usize> {
        let mut sizes: Vec<usize> = self.buckets.iter().map(|b| b.batch).collect();
        sizes.dedup();
        sizes
    }

    /// The length buckets, ascending, for a model with a sequence length (empty
    /// otherwise): a run of length `S` pads to the first at least `S`.
    pub fn length_buckets(&self) -> &[usize] {
        &self.lengths
    }

    /// The length bucket a run of length `length` pads to.
    fn length_bucket(&self, length: usize) -> Result<Option<usize>, Error> {
        if self.lengths.is_empty() {
            return Ok(None);
        }
        match self.lengths.iter().find(|&&l| l >= length) {
            Some(&l) if length > 0 => Ok(Some(l)),
            _ => Err(Error::InvalidArgument(format!(
                "sequence length {length} is outside 1..={} (DynamicOptions::max_sequence)",
                self.lengths.last().copied().unwrap_or(0)
            ))),
        }
    }

    /// The largest chunk a batch is split into: the largest bucket whose run-time memory,
    /// estimated as its size times bucket 1's arena, fits the cache
    /// ([`DynamicOptions::cache_bytes`]); at least 1. Compiles bucket 1 on first use.
    ///
    /// Why: a bucket runs layer by layer over its whole batch, and once a layer's
    /// activations of every element no longer fit the last-level cache each layer streams
    /// them from memory. ResNet-50 on a 32 MiB L3 (arena 9 MB per element) ran at 31.5 ms
    /// per element as batch 1, 29.9 as batch 2 and 36.6 as batch 8 (one thread).
    /// A model with a sequence length runs buckets one element at a time (its padding is
    /// proved at batch 1), copies of bucket 1 in runs its length bucket's arena bounds
    /// the same way.
    pub fn largest_chunk(&self) -> Result<usize, Error> {
        self.no_symbols("the largest chunk")?;
        if !self.lengths.is_empty() {
            return Ok(1);
        }
        Ok(self.fitting_cache(self.compiled(1, None)?.exe.arena_bytes()))
    }

    /// The largest power of two up to [`DynamicOptions::max_bucket`] whose multiple of
    /// `per_element` arena bytes fits the cache; at least 1.
    fn fitting_cache(&self, per_element: usize) -> usize {
        let per_element = per_element.max(1) as u64;
        std::iter::successors(Some(1usize), |&b| b.checked_mul(2))
            .take_while(|&b| {
                b == 1
                    || (b <= self.dynamic.max_bucket
                        && (b as u64).saturating_mul(per_element) <= self.cache_bytes)
            })
            .last()
            .unwrap_or(1)
    }

    /// The chunks a run of `batch` elements is split into, largest first: as many of the
    /// largest chunk ([`DynamicExecutable::largest_chunk`]) as fit, then the rest — as
    /// one chunk when bucket 1 runs copies of itself ([`DynamicOptions::batch_copies`]),
    /// else as its binary digits (a batch of 7 with largest chunk 8 runs as one chunk
    /// of 7, or as 4, 2 and 1). For a model with a sequence, at sequence length
    /// `length` (ignored otherwise): its length bucket's arena bounds the chunks.
    pub fn chunks(&self, batch: usize, length: usize) -> Result<Vec<usize>, Error> {
        Ok(self
            .chunk_plan(batch, length)?
            .iter()
            .map(|c| c.size)
            .collect())
    }

    /// The chunks of [`DynamicExecutable::chunks`] with the bucket each runs on: its own
    /// size, or 1 for a chunk run as copies of bucket 1 (at `length`, as there).
    /// Compiles bucket 1 (the answer depends on its arena and whether it runs copies).
    pub fn chunk_plan(&self, batch: usize, length: usize) -> Result<Vec<Chunk>, Error> {
        self.chunk_runs(batch, self.length_bucket(length)?)
    }

    /// [`DynamicExecutable::chunk_plan`] at length bucket `length` for a model with a
    /// sequence.
    fn chunk_runs(&self, batch: usize, length: Option<usize>) -> Result<Vec<Chunk>, Error> {
        if batch >= 2 && self.runs_copies(length)? {
            // copies run at batch 1, so a sequence's padding proof holds for each; the
            // cache bounds a run's arenas as it bounds a bucket's — unless the copies run
            // whole, one per thread at a time, in one arena per thread: then one run
            // of the whole batch shares the copies out between the threads to the end
            let one = &self.compiled(1, length)?.exe;
            let largest = match one.copies_share_arenas() {
                true => batch,
                false => self.fitting_cache(one.arena_bytes()),
            };
            let copies = |size| Chunk { size, bucket: 1 };
            let mut chunks = vec![copies(largest); batch / largest];
            if !batch.is_multiple_of(largest) {
                chunks.push(copies(batch % largest));
            }
            return Ok(chunks);
        }
        let largest = self.largest_chunk()?;
        let mut chunks = Vec::new();
        let mut left = batch;
        for b in self
            .bucket_sizes()
            .into_iter()
            .rev()
            .filter(|&b| b <= largest)
        {
            while left >= b {
                chunks.push(Chunk { size: b, bucket: b });
                left -= b;
            }
        }
        Ok(chunks)
    }

    /// Whether bucket 1 (at length bucket `length`, for a model with a sequence) runs
    /// any batch as copies of itself (compiling it): allowed by the options, by its
    /// executable, and by the model's computing each element of the batch on its own
    /// (the batch proof of a split into chunks of 1 at that length).
    fn runs_copies(&self, length: Option<usize>) -> Result<bool, Error> {
        if !self.dynamic.batch_copies {
            return Ok(false);
        }
        let decided = |copies: &BTreeMap<Option<usize>, Result<(), String>>| {
            copies.get(&length).map(Result::is_ok)
        };
        if let Some(verdict) = decided(&*lock(&self.copies)?) {
            return Ok(verdict);
        }
        let verdict = match self.compiled(1, length)?.copies.clone() {
            Some(Ok(())) => self
                .split_proof(1, length)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Some(Err(why)) => Err(why),
            None => Err("bucket 1 has no batch".into()),
        };
        let ok = verdict.is_ok();
        lock(&self.copies)?.entry(length).or_insert(verdict);
        Ok(ok)
    }

    /// The specializations compiled so far, by batch (for a model with symbols, by the
    /// symbols' values in the order they were first run, then by batch; only those kept).
    pub fn specializations(&self) -> Vec<Specialization> {
        let mut all: Vec<Specialization> = self
            .buckets
            .iter()
            .filter_map(|b| {
                let slot = b.compiled.lock().ok()?;
                slot.as_ref().map(|c| Specialization {
                    batch: b.batch,
                    length: b.length,
                    symbols: Vec::new(),
                    compile_ms: c.compile_ms,
                    warnings: c.warnings.clone(),
                    valid_rows: c.valid_rows.clone(),
                    copies: match b.batch {
                        1 => self
                            .copies
                            .lock()
                            .ok()
                            .and_then(|c| c.get(&b.length).cloned()),
                        _ => None,
                    },
                })
            })
            .collect();
        if let Ok(Some(padding)) = self.image_padding.lock().as_deref().cloned() {
            if let Ok(model) = &padding.model {
                all.extend(model.specializations());
            }
        }
        if let Ok(shaped) = self.shaped.lock() {
            for (values, exe) in shaped.iter() {
                all.extend(exe.specializations().into_iter().map(|s| Specialization {
                    symbols: values.clone(),
                    ..s
                }));
            }
        }
        if let Some(exact) = self.exact_lengths.get() {
            let note = Diagnostic {
                severity: Severity::Warning,
                ..exact.refusal.clone()
            }
            .with_note(
                "so the sequence length is compiled exactly for each length run, not \
                 padded to a bucket",
            );
            all.extend(exact.exe.specializations().into_iter().map(|mut s| {
                s.warnings.insert(0, note.clone());
                s
            }));
        }
        all
    }

    /// The names of the symbols compiled exactly per value (an image's height and
    /// width), in [`DynamicDim::Symbol`]'s order; empty for a model without them.
    pub fn symbols(&self) -> &[String] {
        match self.exact_lengths.get() {
            Some(exact) => &exact.exe.symbols,
            None => &self.symbols,
        }
    }

    /// Refuses a question whose answer depends on the symbols' values.
    fn no_symbols(&self, what: &str) -> Result<(), Error> {
        match self.symbols.is_empty() {
            true => Ok(()),
            false => Err(Error::InvalidArgument(format!(
                "{what} depends on the sizes of the symbols {}: plan a run of given shapes \
                 (DynamicExecutable::plan, warm_up_shapes)",
                self.symbols.join(", ")
            ))),
        }
    }

    /// The executable of the symbols' values in inputs of `shapes`, for a model with
    /// symbols (compiled buckets on first use; the least recently run set dropped past
    /// `max_shapes`); `None` for a model without them.
    fn shaped_for(&self, shapes: &[&[usize]]) -> Result<Option<Arc<DynamicExecutable>>, Error> {
        if self.symbols.is_empty() {
            return Ok(None);
        }
        let values = self.symbol_values(shapes)?;
        self.shaped_at(values).map(Some)
    }

    /// The symbols' values in inputs of `shapes` (a model with symbols): each input's
    /// rank checked, no symbol 0, inputs that share a symbol agreeing.
    fn symbol_values(&self, shapes: &[&[usize]]) -> Result<Vec<usize>, Error> {
        if shapes.len() != self.inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                shapes.len()
            )));
        }
        let mut values: Vec<Option<(usize, &str)>> = vec![None; self.symbols.len()];
        for (dims, info) in shapes.iter().zip(&self.inputs) {
            if dims.len() != info.dims.len() {
                return Err(Error::InvalidArgument(format!(
                    "input {} has rank {}, not {} (shape {dims:?})",
                    info.name,
                    dims.len(),
                    info.dims.len()
                )));
            }
            for (k, (&got, want)) in dims.iter().zip(&info.dims).enumerate() {
                let DynamicDim::Symbol(s) = *want else {
                    continue;
                };
                let symbol = &self.symbols[s];
                match values[s] {
                    _ if got == 0 => {
                        return Err(Error::InvalidArgument(format!(
                            "input {} dimension {k} ('{symbol}') is 0",
                            info.name
                        )))
                    }
                    Some((v, first)) if v != got => {
                        return Err(Error::InvalidArgument(format!(
                            "input {} dimension {k} ('{symbol}') is {got} but input {first} \
                             has '{symbol}' = {v}: the inputs share it",
                            info.name
                        )))
                    }
                    Some(_) => {}
                    None => values[s] = Some((got, &info.name)),
                }
            }
        }
        Ok(values.iter().map(|v| v.map_or(1, |(v, _)| v)).collect())
    }

    /// The executable of these symbol values (compiled buckets on first use; the least
    /// recently run set dropped past `max_shapes`).
    fn shaped_at(&self, values: Vec<usize>) -> Result<Arc<DynamicExecutable>, Error> {
        let mut shaped = self
            .shaped
            .lock()
            .map_err(|_| Error::Unsupported("a shaped compile panicked".into()))?;
        recently_used(&mut shaped, &values, self.dynamic.max_shapes, || {
            self.shaped_exe(&values)
        })
    }

    /// A new executable of these symbol values: this one with them pinned.
    fn shaped_exe(&self, values: &[usize]) -> Result<Arc<DynamicExecutable>, Error> {
        let mut options = self.options.clone();
        let inputs: Vec<DynamicInput> = self
            .inputs
            .iter()
            .map(|i| {
                let dims: Vec<DynamicDim> = i
                    .dims
                    .iter()
                    .map(|d| match *d {
                        DynamicDim::Symbol(s) => DynamicDim::Fixed(values[s]),
                        other => other,
                    })
                    .collect();
                let input = DynamicInput { dims, ..i.clone() };
                if i.symbolic() && !input.batched() {
                    // every dim known now: the import pins it as a whole
                    options
                        .load
                        .input_shapes
                        .insert(i.name.clone(), input.dims_at(1, 1));
                }
                input
            })
            .collect();
        Ok(Arc::new(self.sibling(&options, inputs, Vec::new())?))
    }

    /// Compiles everything a run on inputs of `shapes` needs, so that such runs compile
    /// nothing: for a model with symbols, the executables of their values.
    pub fn warm_up_shapes(&self, shapes: &[&[usize]]) -> Result<(), Error> {
        self.plan(shapes).map(drop)
    }

    /// Compiles every bucket a run of `batch` elements needs (and checks it can be split),
    /// so that the run itself compiles nothing; for a model with a sequence, at
    /// `length` (ignored otherwise).
    pub fn warm_up(&self, batch: usize, length: usize) -> Result<(), Error> {
        self.no_symbols("warm_up")?;
        let shapes: Vec<Vec<usize>> = self
            .inputs
            .iter()
            .map(|i| i.dims_at(batch, length))
            .collect();
        let shapes: Vec<&[usize]> = shapes.iter().map(Vec::as_slice).collect();
        self.plan(&shapes).map(drop)
    }

    /// Which results carry the batch, proved for a split whose largest chunk is
    /// `largest`: by that bucket's module when it is 2 or more, else by the model loaded
    /// (not compiled) at batch 2, once.
    fn split_proof(&self, largest: usize, length: Option<usize>) -> Result<Vec<bool>, Error> {
        if largest >= 2 {
            return Ok(self.compiled(largest, length)?.batched()?.to_vec());
        }
        let mut proofs = self
            .unit_proofs
            .lock()
            .map_err(|_| Error::Unsupported("a batch analysis panicked".into()))?;
        if !proofs.iter().any(|(l, _)| *l == length) {
            let module = self.module_at(2, length.unwrap_or(1))?;
            let proof = self.separable_results(&module, 2, length)?;
            proofs.push((length, proof));
        }
        match proofs.iter().find(|(l, _)| *l == length) {
            Some((_, Ok(batched))) => Ok(batched.clone()),
            Some((_, Err(d))) => Err(Error::from(d.clone())),
            None => Err(Error::Unsupported("no batch analysis".into())),
        }
    }

    /// The model with its batch pinned to `batch` and its sequence length (for a model
    /// with one; ignored otherwise) to `length`, any sizes, not only a bucket's: loaded
    /// and verified but not compiled, the reference a run of that shape is checked
    /// against.
    pub fn module_at(&self, batch: usize, length: usize) -> Result<smelt_ir::Module, Error> {
        self.no_symbols("module_at")?;
        let sequenced = !self.lengths.is_empty();
        if batch == 0 || (sequenced && length == 0) {
            return Err(Error::InvalidArgument(
                "the batch and the sequence length must be at least 1".into(),
            ));
        }
        let shapes = self.shapes_at(batch, length);
        let import = |shapes| {
            self.decoded()?.import(&ImportOptions {
                input_shapes: shapes,
                ..self.import_options()
            })
        };
        match &self.template()?.modules {
            Ok(template) => match specialize(&template.imported, &shapes) {
                Ok(module) => Ok(module),
                // sizes the symbolic module cannot take (its symbols were refined to
                // multiples the third import checked) may still import as they are; if
                // they do not either, the symbolic refusal names the input and dimension
                Err(refusal) => import(shapes).map_err(|_| Error::from(refusal)),
            },
            Err(_) => import(shapes),
        }
    }

    /// The shapes of the inputs at batch `batch` and sequence length `length`, the pinned
    /// ones included: what a bucket's module is specialized at.
    fn shapes_at(&self, batch: usize, length: usize) -> BTreeMap<String, Vec<usize>> {
        let mut shapes = self.options.load.input_shapes.clone();
        for input in self.inputs.iter().filter(|i| i.batched() || i.sequenced()) {
            shapes.insert(input.name.clone(), input.dims_at(batch, length));
        }
        shapes
    }

    /// Where the buckets' modules come from: the model optimized once with symbolic
    /// sizes, or each bucket's own import (see [`SharedModule`]).
    pub fn shared_module(&self) -> SharedModule {
        let slot = match self.template.lock() {
            Ok(slot) => slot.clone(),
            Err(_) => None,
        };
        match slot {
            None => SharedModule::Pending,
            Some(t) => match &t.modules {
                Ok(_) => SharedModule::Symbolic { ms: t.ms },
                Err(reason) => SharedModule::PerBucket {
                    reason: reason.clone(),
                    ms: t.ms,
                },
            },
        }
    }

    /// The template, made on first use: the model imported with symbolic sizes (the
    /// caller's pins kept) and optimized by `options.optimize`, or why it cannot be.
    fn template(&self) -> Result<Arc<Template>, Error> {
        made_once(&self.template, "a symbolic import", || self.make_template())
    }

    /// [`DynamicExecutable::template`]'s make.
    fn make_template(&self) -> Result<Template, Error> {
        let decoded = self.decoded()?;
        let start = Instant::now();
        let root = ImportOptions {
            input_shapes: self.root_pins.clone(),
            ..self.import_options()
        };
        let modules = (|| {
            let imported = try_import_symbolic(&decoded, &root)?;
            let mut optimized = imported.clone();
            let cx = optimize(&mut optimized, &self.options.optimize, None)?;
            Ok::<_, Error>(TemplateModules {
                imported,
                optimized,
                warnings: cx.warnings,
            })
        })();
        Ok(Template {
            ms: start.elapsed().as_secs_f64() * 1e3,
            modules: modules.map_err(|e| e.to_string()),
        })
    }

    /// The import options of `options.load`.
    fn import_options(&self) -> ImportOptions {
        let load = &self.options.load;
        ImportOptions {
            input_shapes: load.input_shapes.clone(),
            interface: load.interface,
            allowed_root: load.allowed_root.clone(),
            memory_budget: load.memory_budget,
            ..ImportOptions::default()
        }
    }

    /// The model file, decoded on first use.
    fn decoded(&self) -> Result<Arc<DecodedModel>, Error> {
        made_once(&self.decoded, "a model decode", || {
            decode_file(&self.path, &self.import_options())
        })
    }

    /// The executable of the bucket of `size` elements (one of
    /// [`DynamicExecutable::bucket_sizes`]) and, for a model with a sequence length, of
    /// the length bucket of `length` (ignored otherwise), compiled on first use: its
    /// kernels, arena and profile are those of every chunk of that size.
    pub fn bucket(&self, size: usize, length: usize) -> Result<Arc<Executable>, Error> {
        let bucket = self.length_bucket(length)?;
        Ok(self.compiled(size, bucket)?.exe.clone())
    }

    /// Floating-point operations of a run of `batch` elements, summed over its chunks:
    /// as the model writes them (at the run's own length: a padded run imports the
    /// model at it once more) and as the kernels execute them (they differ where
    /// Winograd computes, and where a padded run's kernels compute past its length up
    /// to a register block or not at all); a chunk run as copies of bucket 1 counts
    /// each copy. Compiles the buckets the run needs.
    pub fn flops(&self, batch: usize, length: usize) -> Result<(u64, u64), Error> {
        let bucket = self.length_bucket(length)?;
        let padded = bucket.is_some_and(|b| length < b);
        // a padded run's flops as written: the model imported at its length, once per
        // bucket size its chunks run
        let mut at_length: Vec<(usize, u64)> = Vec::new();
        self.chunk_runs(batch, bucket)?.into_iter().try_fold(
            (0, 0),
            |(written, executed), chunk| {
                let c = self.compiled(chunk.bucket, bucket)?;
                // a chunk run as copies of a bucket computes that many times its flops
                let share = |flops: u64| flops / chunk.bucket as u64 * chunk.size as u64;
                let (as_written, as_run) = match padded {
                    true => {
                        let known = at_length.iter().find(|(b, _)| *b == chunk.bucket);
                        let written = match known {
                            Some(&(_, flops)) => flops,
                            None => {
                                let module = self.module_at(chunk.bucket, length)?;
                                let flops = module.entry().map_or(0, |f| f.flops());
                                at_length.push((chunk.bucket, flops));
                                flops
                            }
                        };
                        (written, c.exe.executed_flops_at(length))
                    }
                    false => (c.flops, c.exe.executed_flops()),
                };
                Ok((written + share(as_written), executed + share(as_run)))
            },
        )
    }

    /// The bucket of `batch` elements (a bucket size) at length bucket `length`,
    /// compiled on first use.
    fn compiled(&self, batch: usize, length: Option<usize>) -> Result<Arc<Compiled>, Error> {
        self.no_symbols("a bucket")?;
        let slot = self
            .buckets
            .iter()
            .find(|b| b.batch == batch && b.length == length)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "no bucket of batch {batch} and length {length:?} (batches {:?}, \
                     lengths {:?})",
                    self.bucket_sizes(),
                    self.lengths
                ))
            })?;
        made_once(&slot.compiled, "a bucket's compile", || {
            self.compile_bucket(batch, length)
        })
    }

    /// The bucket of `batch` elements at length bucket `length`, compiled.
    fn compile_bucket(&self, batch: usize, length: Option<usize>) -> Result<Compiled, Error> {
        // made once for every bucket: not this bucket's compile time
        let template = self.template()?;
        let start = Instant::now();
        let module = self.module_at(batch, length.unwrap_or(1))?;
        let separable = match batch >= 2 {
            true => Some(self.separable_results(&module, batch, length)?),
            false => None,
        };
        let padded = match length {
            Some(padded) => Some(self.padding(&module, batch, padded)?),
            None => None,
        };
        let flops = module.entry().map_or(0, |f| f.flops());
        // the model optimized at `batch` and `length`: the shared module specialized,
        // or, where there is none or it cannot take these sizes, `module` optimized
        let optimized_at = |module: &smelt_ir::Module, length: usize| {
            let shapes = self.shapes_at(batch, length);
            if let Ok(t) = &template.modules {
                if let Ok(optimized) = specialize(&t.optimized, &shapes) {
                    return Ok((optimized, t.warnings.clone()));
                }
            }
            let mut optimized = module.clone();
            let cx = optimize(&mut optimized, &self.options.optimize, None)?;
            Ok::<_, Error>((optimized, cx.warnings))
        };
        // Products whose rows are the padded positions stop at each run's valid length
        // where the analysis of the optimized model says those rows may hold anything:
        // the model optimized at the shortest length the bucket serves shows which axes
        // are the sequence. It is optimized on a second thread beside the bucket's own
        // (fusion is serial; each takes ≈ 10 ms for BERT).
        let shortest = match (&padded, length) {
            (Some((_, Some((short, small)))), Some(_)) => Some((*short, small)),
            _ => None,
        };
        let optimized_at = &optimized_at;
        let (own, small) = std::thread::scope(|scope| {
            let small = shortest.map(|(short, small)| {
                scope.spawn(move || optimized_at(small, short).map(|(m, _)| (short, m)))
            });
            let own = optimized_at(&module, length.unwrap_or(1));
            let small = small.map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::Unsupported("optimizing panicked".into())))
            });
            (own, small)
        });
        let (optimized, warnings) = own?;
        let valid_rows = match (small, length) {
            (Some(small), Some(bucket)) => Some(small.and_then(|(short, small)| {
                padded_rows(&optimized, &small, bucket, short).map_err(Error::from)
            })),
            _ => None,
        };
        let rows = valid_rows.as_ref().and_then(|r| r.as_ref().ok());
        let mut exe =
            Executable::compile_sharing(&optimized, rows, &self.constants, &self.options.compile)?;
        let valid_rows = valid_rows.map(|r| match r {
            Ok(_) if exe.padded_rows().is_some() => Ok(()),
            Ok(_) => Err("no product computes the padded positions as its rows".to_string()),
            Err(e) => Err(e.to_string()),
        });
        let padded = padded.map(|(axes, _)| axes);
        let copies = (batch == 1).then(|| {
            let batched: Vec<bool> = exe
                .inputs()
                .iter()
                .map(|i| self.inputs.iter().any(|d| d.name == i.name && d.batched()))
                .collect();
            exe.allow_batch_copies(&batched)
        });
        Ok(Compiled {
            exe: Arc::new(exe),
            compile_ms: start.elapsed().as_secs_f64() * 1e3,
            flops,
            warnings,
            separable,
            padded,
            valid_rows,
            copies,
        })
    }

    /// Proves that `module`, the model at `batch` and length bucket `padded`, may run
    /// any length the bucket serves padded to it; returns each result's sequence axes,
    /// and the shortest length the bucket serves with the model at it (none when the
    /// bucket serves only its own length).
    fn padding(
        &self,
        module: &smelt_ir::Module,
        batch: usize,
        padded: usize,
    ) -> Result<PaddedBucket, Error> {
        let below = self.lengths.iter().copied().filter(|&l| l < padded).max();
        let short = below.map_or(1, |l| l + 1);
        if short >= padded {
            // the bucket serves only its own length: nothing is ever padded
            let func = module
                .entry()
                .ok_or_else(|| Error::Unsupported(module.no_entry_reason()))?;
            return Ok((func.results.iter().map(|_| Vec::new()).collect(), None));
        }
        let small = self.module_at(batch, short)?;
        let proof = padding_proof(module, &small, padded, short)?;
        Ok((proof.results, Some((short, small))))
    }

    /// Which results of `module` (the model at `batch` and length bucket `length`) carry
    /// the batch, or the diagnostic of why it cannot be split; `Err` only for a failure
    /// to load the model at batch 1, which a gather along the batch is checked against.
    fn separable_results(
        &self,
        module: &smelt_ir::Module,
        batch: usize,
        length: Option<usize>,
    ) -> Result<Separability, Error> {
        let Some(func) = module.entry() else {
            return Ok(Err(Diagnostic::error(
                "batch-analysis",
                module.no_entry_reason(),
                smelt_ir::Location::Unknown,
            )));
        };
        let params: Vec<Option<BatchAxis>> = func
            .params
            .iter()
            .map(|p| {
                self.inputs
                    .iter()
                    .find(|i| i.name == p.name)
                    .filter(|i| i.batched())
                    .map(|_| BatchAxis::LEADING)
            })
            .collect();
        let analysis = match batch_axes(func, &module.weights, &params, batch) {
            Ok(a) => a,
            Err(d) => return Ok(Err(d)),
        };
        if !analysis.element_gathers.is_empty() {
            let single = self.module_at(1, length.unwrap_or(1))?;
            if let Err(d) = same_element_gathers(func, &single, &analysis.element_gathers) {
                return Ok(Err(d));
            }
        }
        Ok(leading_results(func, &analysis.axes))
    }

    /// The packed weights its buckets share (computed by the first that needs each,
    /// taken by the others): how many, their bytes, and how many times a bucket's
    /// compile took one instead of packing it again.
    pub fn shared_constants(&self) -> smelt_passes::lower::ConstantUsage {
        self.constants.usage()
    }

    /// The names of the results, in order (as the model declares them).
    pub fn output_names(&self) -> &[String] {
        &self.outputs
    }

    /// The types of the results of a run whose inputs have `input_shapes` (checked as
    /// [`DynamicExecutable::run`] checks them); compiles the buckets the run needs.
    pub fn output_types(&self, input_shapes: &[&[usize]]) -> Result<Vec<TensorType>, Error> {
        Ok(self.plan(input_shapes)?.results)
    }

    /// Runs on host tensors of any batch: every batched input must have the same leading
    /// size `n ≥ 1` and its other dims as declared. Returns the results at batch `n`.
    pub fn run(&self, inputs: &[Tensor]) -> Result<Vec<Tensor>, Error> {
        self.check_types(inputs.iter().map(|t| &t.ty))?;
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| &t.ty.dims[..]).collect();
        let plan = self.plan(&shapes)?;
        let mut results: Vec<Tensor> = plan.results.iter().map(Tensor::zeros).collect();
        let ins: Vec<Elements<'_>> = inputs.iter().map(|t| Elements::of(&t.data)).collect();
        let mut outs: Vec<ElementsMut<'_>> = results
            .iter_mut()
            .map(|t| ElementsMut::of(&mut t.data))
            .collect();
        self.run_planned(&plan, &shapes, &ins, &mut outs)?;
        Ok(results)
    }

    /// Runs `inputs` as [`DynamicExecutable::run`] does and times every kernel call of
    /// the bucket that runs them ([`Executable::run_profiled`]): a run of length `S` in
    /// its length bucket is profiled padded, at its valid rows, as it runs. Only for a
    /// run that one bucket executes whole (not split into chunks, not copies of a
    /// smaller bucket, not a model with image sizes or exact lengths): an
    /// `InvalidArgument` error says which. Compiles the bucket on first use.
    pub fn profile(&self, inputs: &[Tensor]) -> Result<Vec<KernelProfile>, Error> {
        self.check_types(inputs.iter().map(|t| &t.ty))?;
        let one = |why: &str| {
            Error::InvalidArgument(format!(
                "a profile times one bucket's executable, and {why}: pin the input shapes \
                 (`LoadOptions::input_shapes`) to profile"
            ))
        };
        if !self.symbols.is_empty() || self.exact_lengths.get().is_some() {
            return Err(one("this model's sizes are compiled per shape"));
        }
        let shapes: Vec<&[usize]> = inputs.iter().map(|t| &t.ty.dims[..]).collect();
        let (n, length) = self.shape_of(&shapes)?;
        let bucket = match length {
            Some(l) => self.length_bucket(l)?,
            None => None,
        };
        let chunks = self.chunk_runs(n, bucket)?;
        let [chunk] = chunks.as_slice() else {
            return Err(one(&format!("batch {n} runs as {} chunks", chunks.len())));
        };
        if chunk.copies() {
            return Err(one(&format!(
                "batch {n} runs as copies of bucket {}",
                chunk.bucket
            )));
        }
        let exe = self.compiled(chunk.bucket, bucket)?.exe.clone();
        let (Some(length), Some(padded)) = (length, bucket) else {
            return Ok(exe.run_profiled(inputs)?.1);
        };
        let mut at_bucket = Vec::with_capacity(inputs.len());
        for (t, info) in inputs.iter().zip(&self.inputs) {
            if !info.sequenced() {
                at_bucket.push(t.clone());
                continue;
            }
            at_bucket.push(info.padded_to(Elements::of(&t.data), n, length, padded)?);
        }
        Ok(exe.run_profiled_valid_rows(Some(length), &at_bucket)?.1)
    }

    /// Runs on the caller's buffers: input `i` has shape `input_shapes[i]` (row-major)
    /// and its elements in `inputs[i]`; `outputs[i]` holds exactly the elements of result
    /// `i` as [`DynamicExecutable::output_types`] gives it for these shapes. Allocates
    /// only the scratch of results that do not depend on the batch, when a run is split
    /// (and compiles the buckets it needs on first use).
    pub fn run_into(
        &self,
        input_shapes: &[&[usize]],
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        let plan = self.plan(input_shapes)?;
        self.run_planned(&plan, input_shapes, inputs, outputs)
    }

    /// [`DynamicExecutable::run_into`] with a plan made by [`DynamicExecutable::plan`] for
    /// these `input_shapes` (checked against it): a caller that sized its outputs from
    /// the plan's types plans once.
    pub fn run_planned(
        &self,
        plan: &RunPlan,
        input_shapes: &[&[usize]],
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        if let Some(padded) = &plan.padded {
            return self.run_padded(padded, &plan.results, input_shapes, inputs, outputs);
        }
        match &plan.shaped {
            Some(shaped) => shaped.run_planned_here(plan, input_shapes, inputs, outputs),
            None if !self.symbols.is_empty() => Err(Error::InvalidArgument(
                "the plan was not made by this executable".into(),
            )),
            None => self.run_planned_here(plan, input_shapes, inputs, outputs),
        }
    }

    /// [`DynamicExecutable::run_planned`] by the executable that made `plan`'s chunks.
    fn run_planned_here(
        &self,
        plan: &RunPlan,
        input_shapes: &[&[usize]],
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        let (n, length) = self.shape_of(input_shapes)?;
        if n != plan.batch || length != plan.length() {
            return Err(Error::InvalidArgument(format!(
                "the inputs have batch {n} and sequence length {length:?}, the plan was made \
                 for batch {} and sequence length {:?}",
                plan.batch,
                plan.length()
            )));
        }
        for ((info, e), shape) in self.inputs.iter().zip(inputs).zip(input_shapes) {
            let want: usize = shape.iter().product();
            if e.dtype() != info.dtype || e.len() != want {
                return Err(Error::InvalidArgument(format!(
                    "input {} of shape {shape:?} needs {want} {} elements, got {} {}",
                    info.name,
                    info.dtype,
                    e.len(),
                    e.dtype()
                )));
            }
        }
        if outputs.len() != plan.results.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} outputs, got {}",
                plan.results.len(),
                outputs.len()
            )));
        }
        for ((ty, out), name) in plan.results.iter().zip(outputs.iter()).zip(&self.outputs) {
            if out.dtype() != ty.dtype || out.len() != ty.storage_len() {
                return Err(Error::InvalidArgument(format!(
                    "output {name} is {ty} at batch {n}: it needs {} {} elements, got {} {}",
                    ty.storage_len(),
                    ty.dtype,
                    out.len(),
                    out.dtype()
                )));
            }
        }
        self.run_plan(plan, inputs, outputs)
    }

    /// How a run on inputs of `input_shapes` goes (checked as
    /// [`DynamicExecutable::run`] checks them): its chunks, compiled on first use, and its
    /// results' types.
    pub fn plan(&self, input_shapes: &[&[usize]]) -> Result<RunPlan, Error> {
        if let Some(exact) = self.exact_lengths.get() {
            return exact.exe.plan(input_shapes);
        }
        if let Some(plan) = self.plan_padded(input_shapes)? {
            return Ok(plan);
        }
        if let Some(shaped) = self.shaped_for(input_shapes)? {
            let mut plan = shaped.plan(input_shapes)?;
            plan.shaped = Some(shaped);
            return Ok(plan);
        }
        match self.plan_buckets(input_shapes) {
            Err(e) => match padding_refusal(&e) {
                Some(refusal) => self.exact_lengths_after(refusal)?.exe.plan(input_shapes),
                None => Err(e),
            },
            plan => plan,
        }
    }

    /// The executable that compiles each sequence length exactly, made when the padding
    /// proof first refuses the model (`refusal`) and kept from then on: a window along
    /// the sequence (a text-line recognizer's convs over its width) reads padded
    /// positions into valid ones, so no bucket can serve two lengths.
    fn exact_lengths_after(&self, refusal: Diagnostic) -> Result<&ExactLengths, Error> {
        if let Some(exact) = self.exact_lengths.get() {
            return Ok(exact);
        }
        let Some(name) = self.sequence_name.clone() else {
            return Err(Error::from(refusal));
        };
        let inputs = self
            .inputs
            .iter()
            .map(|i| DynamicInput {
                dims: i
                    .dims
                    .iter()
                    .map(|d| match d {
                        DynamicDim::Sequence => DynamicDim::Symbol(0),
                        other => *other,
                    })
                    .collect(),
                ..i.clone()
            })
            .collect();
        let exact = ExactLengths {
            refusal,
            exe: Arc::new(self.sibling(&self.options, inputs, vec![name])?),
        };
        // two runs refused at once: the first one's executable is kept
        let _ = self.exact_lengths.set(exact);
        self.exact_lengths
            .get()
            .ok_or_else(|| Error::Unsupported("the exact-length executable is missing".into()))
    }

    /// This model as another [`DynamicExecutable`] with `inputs` (this one's, some dims
    /// pinned or made symbols) and `symbols`, which reads the file this one decoded.
    fn sibling(
        &self,
        options: &Options,
        inputs: Vec<DynamicInput>,
        symbols: Vec<String>,
    ) -> Result<DynamicExecutable, Error> {
        let exe = Self::assemble(
            &self.path,
            options,
            self.dynamic,
            inputs,
            self.outputs.clone(),
            symbols,
        )?;
        if let Ok(mut d) = exe.decoded.lock() {
            *d = Some(self.decoded()?);
        }
        Ok(DynamicExecutable {
            template: self.template.clone(),
            root_pins: self.root_pins.clone(),
            constants: self.constants.clone(),
            ..exe
        })
    }

    /// [`DynamicExecutable::plan`] for a model run by its buckets.
    fn plan_buckets(&self, input_shapes: &[&[usize]]) -> Result<RunPlan, Error> {
        let (n, length) = self.shape_of(input_shapes)?;
        let bucket = match length {
            Some(length) => self.length_bucket(length)?,
            None => None,
        };
        let runs = self.chunk_runs(n, bucket)?;
        let sizes: Vec<usize> = runs.iter().map(|c| c.size).collect();
        let chunks: Vec<Arc<Compiled>> = runs
            .iter()
            .map(|c| self.compiled(c.bucket, bucket))
            .collect::<Result<_, _>>()?;
        let (first, size) = (&chunks[0], runs[0].bucket);
        let separable = match &runs[..] {
            // one chunk of the bucket's size: the results are the bucket's own
            [only] if !only.copies() => vec![false; first.exe.outputs().len()],
            // the largest chunk's bucket (2 or more elements) proves the split, and bucket
            // 1 the split into copies of itself
            _ => {
                let batched = self.split_proof(size, bucket)?;
                let copied = chunks.iter().zip(&runs).filter(|(_, c)| c.copies());
                for (c, _) in copied {
                    if c.exe.batch_copies().map(|(_, r)| r) != Some(&batched[..]) {
                        return Err(Error::Unsupported(
                            "the batch proof and the executable disagree on which results \
                             hold the batch"
                                .into(),
                        ));
                    }
                }
                batched
            }
        };
        let padded = first.padded.clone().unwrap_or_default();
        let results = first
            .exe
            .outputs()
            .enumerate()
            .map(|(k, o)| {
                let ty = scaled(&o.ty, separable[k], size, n)?;
                Ok(match (length, padded.get(k)) {
                    (Some(length), Some(axes)) => with_length(ty, axes, length),
                    _ => ty,
                })
            })
            .collect::<Result<_, Error>>()?;
        Ok(RunPlan {
            batch: n,
            length: length.zip(bucket),
            sizes,
            chunks,
            separable,
            results,
            shaped: None,
            padded: None,
        })
    }

    /// Runs `plan` on checked buffers: each chunk reads contiguous ranges of the batched
    /// inputs and writes contiguous ranges of the batched results; a run shorter than
    /// its length bucket pads its inputs into zeroed copies and takes its results'
    /// prefixes from scratch results of the bucket's size.
    fn run_plan(
        &self,
        plan: &RunPlan,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        let n = plan.batch;
        let padding = plan.length.filter(|&(length, bucket)| length < bucket);
        // a chunk larger than its bucket runs as copies of it; a padded run's products
        // stop at its valid length where they may
        let valid_rows = padding.map(|(length, _)| length);
        let run =
            |exe: &Executable, size: usize, ins: &[Elements<'_>], outs: &mut [ElementsMut<'_>]| {
                let copies = match exe.batch_copies() {
                    Some((batch, _)) if size > batch => size / batch,
                    _ => 1,
                };
                exe.run_copies_into(copies, valid_rows, ins, outs)
            };
        if let ([only], [size], None) = (&plan.chunks[..], &plan.sizes[..], padding) {
            return run(&only.exe, *size, inputs, outputs);
        }
        let mut offset = 0;
        for (compiled, &size) in plan.chunks.iter().zip(&plan.sizes) {
            let exe = &compiled.exe;
            let mut ins: Vec<Elements<'_>> = inputs
                .iter()
                .zip(&self.inputs)
                .map(|(&e, info)| match info.batched() {
                    true => chunk_of(e, e.len() / n, offset, size),
                    false => Ok(e),
                })
                .collect::<Result<_, _>>()?;
            let mut padded_inputs: Vec<(usize, Tensor)> = Vec::new();
            if let Some((length, bucket)) = padding {
                for (k, info) in self.inputs.iter().enumerate() {
                    if !info.sequenced() {
                        continue;
                    }
                    padded_inputs.push((k, info.padded_to(ins[k], size, length, bucket)?));
                }
                for (k, whole) in &padded_inputs {
                    ins[*k] = Elements::of(&whole.data);
                }
            }
            // an unbatched result is the same for every chunk: the first writes it, the
            // others write scratch copies; with padding every result is written to
            // scratch of the bucket's size and its valid prefix copied out
            // a chunk run as copies of its bucket holds that many of its batched results
            // (the plan checked the bucket's batched results are the proof's)
            let copies = match exe.batch_copies() {
                Some((batch, _)) if size > batch => size / batch,
                _ => 1,
            };
            let chunk_types = exe.output_types(copies);
            let mut scratch: Vec<Option<Tensor>> = chunk_types
                .iter()
                .zip(&plan.separable)
                .map(|(ty, &batched)| {
                    (padding.is_some() || (!batched && offset > 0)).then(|| Tensor::zeros(ty))
                })
                .collect();
            let bucket_dims: Vec<Vec<usize>> = chunk_types.iter().map(|t| t.dims.clone()).collect();
            let mut outs: Vec<ElementsMut<'_>> = Vec::with_capacity(outputs.len());
            let mut prefixes: Vec<(usize, ElementsMut<'_>, Vec<usize>)> = Vec::new();
            let results = outputs
                .iter_mut()
                .zip(&plan.separable)
                .zip(scratch.iter_mut());
            for (k, ((whole, &batched), slot)) in results.enumerate() {
                let per = whole.len() / n;
                let out = match (batched, offset) {
                    (true, _) => whole.range_mut(offset * per..(offset + size) * per),
                    (false, 0) => whole.range_mut(0..whole.len()),
                    (false, _) => None,
                };
                match slot {
                    None => outs.push(out.ok_or_else(|| {
                        Error::Unsupported("a chunk's result does not fit the batch's".into())
                    })?),
                    Some(full) => {
                        outs.push(ElementsMut::of(&mut full.data));
                        if let Some(out) = out {
                            let mut dims = plan.results[k].dims.clone();
                            if batched {
                                dims[0] = size;
                            }
                            prefixes.push((k, out, dims));
                        }
                    }
                }
            }
            run(exe, size, &ins, &mut outs)?;
            drop(outs);
            for (k, mut out, dims) in prefixes {
                let full = scratch[k]
                    .as_ref()
                    .ok_or_else(|| Error::Unsupported("a chunk's result has no scratch".into()))?;
                copy_common_box(Elements::of(&full.data), &bucket_dims[k], &mut out, &dims)
                    .map_err(Error::Unsupported)?;
            }
            offset += size;
        }
        Ok(())
    }

    /// Checks each input's count, element type, rank and layout.
    fn check_types<'t>(
        &self,
        types: impl ExactSizeIterator<Item = &'t TensorType>,
    ) -> Result<(), Error> {
        if types.len() != self.inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                types.len()
            )));
        }
        for (ty, info) in types.zip(&self.inputs) {
            if ty.dtype != info.dtype
                || ty.dims.len() != info.dims.len()
                || ty.layout != smelt_ir::Layout::RowMajor
            {
                return Err(Error::InvalidArgument(format!(
                    "input {} must be tensor<{}x{}>, got {ty}",
                    info.name,
                    info.shape_text(),
                    info.dtype,
                )));
            }
        }
        Ok(())
    }

    /// The batch and the sequence length (for a model with one) of a run: the shared
    /// leading size of the batched inputs and the shared size of the sequence axes, each
    /// input's count, rank and other dims checked.
    fn shape_of(&self, shapes: &[&[usize]]) -> Result<(usize, Option<usize>), Error> {
        if shapes.len() != self.inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                shapes.len()
            )));
        }
        let mut batch: Option<(usize, &str)> = None;
        let mut length: Option<(usize, &str)> = None;
        for (dims, info) in shapes.iter().zip(&self.inputs) {
            if dims.len() != info.dims.len() {
                return Err(Error::InvalidArgument(format!(
                    "input {} has {} dimensions ({}), got {dims:?}",
                    info.name,
                    info.dims.len(),
                    info.shape_text()
                )));
            }
            for (k, (&got, want)) in dims.iter().zip(&info.dims).enumerate() {
                let (seen, what) = match want {
                    DynamicDim::Fixed(w) if *w != got => {
                        return Err(Error::InvalidArgument(format!(
                            "input {} dimension {k} must be {w}, got {got} (shape {dims:?})",
                            info.name
                        )))
                    }
                    DynamicDim::Fixed(_) | DynamicDim::Symbol(_) => continue,
                    DynamicDim::Batch => (&mut batch, "batch"),
                    DynamicDim::Sequence => (&mut length, "sequence length"),
                };
                match seen {
                    Some((n, first)) if *n != got => {
                        return Err(Error::InvalidArgument(format!(
                            "input {} dimension {k} has {what} {got} but input {first} has \
                             {what} {n}: the inputs share one {what}",
                            info.name
                        )))
                    }
                    Some(_) => {}
                    None => *seen = Some((got, &info.name)),
                }
            }
        }
        for (what, seen) in [("batch", batch), ("sequence length", length)] {
            if let Some((0, name)) = seen {
                return Err(Error::InvalidArgument(format!(
                    "input {name} has {what} 0; a run takes at least one element"
                )));
            }
        }
        let length = length.map(|(l, _)| l);
        match (batch, length) {
            (Some((n, _)), _) => Ok((n, length)),
            (None, Some(_)) => Ok((1, length)),
            // a shaped executable whose inputs are all fixed: one element
            (None, None) => Ok((1, None)),
        }
    }
}

/// How a run of one batch goes ([`DynamicExecutable::plan`]): its chunks (largest
/// first) and their compiled buckets, which results carry the batch, and the results'
/// types at the run's batch. Made once, it runs any number of times.
pub struct RunPlan {
    batch: usize,
    /// The run's sequence length and its length bucket, for a model with one.
    length: Option<(usize, usize)>,
    sizes: Vec<usize>,
    chunks: Vec<Arc<Compiled>>,
    separable: Vec<bool>,
    results: Vec<TensorType>,
    /// For a model with symbols: the executable of the run's symbol values, which runs it.
    shaped: Option<Arc<DynamicExecutable>>,
    /// For image sizes padded to a bucket: the bucket's executable, masks and dims.
    padded: Option<Arc<images::PaddedRun>>,
}

impl RunPlan {
    /// The batch it runs.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The sequence length it runs, for a model with one.
    pub fn length(&self) -> Option<usize> {
        self.length.map(|(length, _)| length)
    }

    /// The length bucket it runs padded to, for a model with a sequence.
    pub fn length_bucket(&self) -> Option<usize> {
        self.length.map(|(_, bucket)| bucket)
    }

    /// The results' types at that batch: what each output buffer holds.
    pub fn output_types(&self) -> &[TensorType] {
        &self.results
    }
}

impl Compiled {
    /// Which results carry the batch, or why this bucket's module cannot be split.
    fn batched(&self) -> Result<&[bool], Error> {
        match &self.separable {
            Some(Ok(batched)) => Ok(batched),
            Some(Err(d)) => Err(Error::from(d.clone())),
            None => Err(Error::Unsupported(
                "bucket 1 has no batch to follow; a split is proved at batch 2".into(),
            )),
        }
    }
}

/// The padding proof's refusal inside `e`, when that is what `e` is.
fn padding_refusal(e: &Error) -> Option<Diagnostic> {
    match e {
        Error::Ir(ds) => ds.0.iter().find(|d| d.code == NOT_PADDABLE).cloned(),
        _ => None,
    }
}

/// The named symbols off the leading axis of the declared inputs not pinned, in order
/// of first appearance.
fn declared_symbols<'d>(inputs: impl Iterator<Item = &'d [InputDim]>) -> Vec<String> {
    let mut symbols: Vec<String> = Vec::new();
    for dims in inputs {
        for d in dims.iter().skip(1) {
            if let InputDim::Dynamic(p) = d {
                if !p.is_empty() && !symbols.contains(p) {
                    symbols.push(p.clone());
                }
            }
        }
    }
    symbols
}

/// The dims of a declared input: a leading dynamic dim is the batch; a named symbol off
/// the leading axis is the sequence length when it is the only one (`symbols` holds
/// one name), else one of the symbols specialized exactly. An unnamed dynamic dim off
/// the leading axis must be pinned.
fn dynamic_dims(
    name: &str,
    dims: Option<&[InputDim]>,
    symbols: &[String],
) -> Result<Vec<DynamicDim>, Error> {
    let dims = dims.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "input '{name}' declares no shape; pin it with its whole shape"
        ))
    })?;
    dims.iter()
        .enumerate()
        .map(|(k, d)| match d {
            InputDim::Fixed(n) => Ok(DynamicDim::Fixed(*n)),
            InputDim::Dynamic(_) if k == 0 => Ok(DynamicDim::Batch),
            InputDim::Dynamic(p) => match symbols.iter().position(|s| s == p) {
                Some(_) if symbols.len() == 1 => Ok(DynamicDim::Sequence),
                Some(index) => Ok(DynamicDim::Symbol(index)),
                None => Err(Error::InvalidArgument(format!(
                    "input '{name}' dimension {k} is dynamic without a name (-1): only a \
                     leading batch and named symbols may stay dynamic; pin the input's \
                     whole shape"
                ))),
            },
        })
        .collect()
}

/// `ty` at batch `n` when it is batched (its leading dim `size` becoming `n`).
fn scaled(ty: &TensorType, batched: bool, size: usize, n: usize) -> Result<TensorType, Error> {
    let mut ty = ty.clone();
    if batched {
        if ty.dims.first() != Some(&size) {
            return Err(Error::Unsupported(format!(
                "a result of the bucket of batch {size} is {ty}, not batched"
            )));
        }
        ty.dims[0] = n;
    }
    Ok(ty)
}

/// Checks that `single` (the model at batch 1) gathers at each of `gathers`' element-0
/// indices, as `func` (the model at a larger batch) does at every element.
fn same_element_gathers(
    func: &smelt_ir::Func,
    single: &smelt_ir::Module,
    gathers: &[ElementGather],
) -> Result<(), Diagnostic> {
    let one = single.entry();
    for g in gathers {
        let inst = &func.insts[g.inst];
        let indices_at_one = one
            .and_then(|f| {
                let i = f.insts.get(g.inst)?;
                let v = *i.operands.get(1)?;
                match (&i.op, f.inst_of(v).map(|d| &d.op)) {
                    (smelt_ir::Op::Gather { .. }, Some(smelt_ir::Op::Const(id))) => {
                        single.weights.get(*id)
                    }
                    _ => None,
                }
            })
            .and_then(|w| w.elements()?.to_i64s());
        if indices_at_one.as_deref() != Some(&g.indices[..]) {
            return Err(Diagnostic::error(
                "batch-not-separable",
                "`gather` selects along the batch axis at positions the model at batch 1 \
                 does not gather at, so a dynamic batch cannot be split into runs of fewer \
                 elements; pin the batch size"
                    .to_string(),
                inst.loc.clone(),
            ));
        }
    }
    Ok(())
}

/// `ty` with its sequence axes `axes` at `length`.
fn with_length(mut ty: TensorType, axes: &[usize], length: usize) -> TensorType {
    for &axis in axes {
        if let Some(d) = ty.dims.get_mut(axis) {
            *d = length;
        }
    }
    ty
}

/// Elements of `size` batch elements from `offset` of a batched input holding `per`
/// elements per batch element.
fn chunk_of(
    all: Elements<'_>,
    per: usize,
    offset: usize,
    size: usize,
) -> Result<Elements<'_>, Error> {
    all.range(offset * per..(offset + size) * per)
        .ok_or_else(|| Error::InvalidArgument("an input is shorter than its batch".into()))
}

/// Locks `m`; a poisoned lock (a panic inside smelt while it was held) is an error.
fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>, Error> {
    m.lock()
        .map_err(|_| Error::Unsupported("a lock of the dynamic executable was poisoned".into()))
}
