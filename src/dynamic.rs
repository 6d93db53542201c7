//! Executables for models with a dynamic batch: compiled for a few batch sizes on first
//! use, a run of any batch split into chunks of those sizes.
//!
//! An ONNX model whose inputs have a dynamic leading dimension (`batch`, `N`, `-1`) can
//! be run at any batch without recompiling for each one. [`DynamicExecutable`] keeps the
//! model's path and options and compiles *buckets*: the model with its batch pinned to
//! a power of two up to [`DynamicOptions::max_bucket`]. A run of `n` elements is split
//! into chunks of bucket sizes, largest first, no chunk larger than the *largest chunk*
//! (below); each chunk's inputs are contiguous ranges of the caller's tensors and its
//! outputs are written straight into ranges of the results, so nothing is copied and
//! nothing is padded. A batch equal to a bucket no larger than the largest chunk is one
//! run of it.
//!
//! The largest chunk is the batch as a blocking dimension of the whole graph: a bucket
//! runs layer by layer over its whole batch, so once a layer's activations for all its
//! elements outgrow the last-level cache every layer streams them from memory. It is the
//! largest bucket whose arena, estimated as its size times bucket 1's, fits the cache
//! ([`DynamicOptions::cache_bytes`], by default the CPU's last-level cache): ResNet-50 at
//! 224² (9 MB per element) runs in chunks of 2 on a 32 MiB L3, MobileNetV3 (2.3 MB) in
//! chunks of 8. Bucket 1 is compiled first, since its arena decides.
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
//! Policy, stated and observable: at most `log2(max_bucket) + 1` specializations exist
//! (4 with the default `max_bucket` of 8), and none above the largest chunk; each is
//! compiled on the first run that needs it and kept for the executable's life
//! ([`DynamicExecutable::specializations`] lists them, [`DynamicExecutable::chunks`]
//! says how a batch will run). Compiles of different buckets may run at once on
//! different threads; two runs needing the same uncompiled bucket wait for one compile.
//! [`DynamicExecutable::warm_up`] compiles the buckets a batch needs ahead of time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use smelt_ir::batch::{batch_axes, leading_results, BatchAxis};
use smelt_ir::{DType, Diagnostic, Tensor, TensorType};

use crate::driver::{compile, Options};
use crate::onnx::{declared_interface, decode_file, DecodedModel, ImportOptions, InputDim};
use crate::runtime::{Elements, ElementsMut, Executable};
use crate::Error;

/// The largest bucket [`DynamicOptions::max_bucket`] may name.
pub const MAX_BUCKET_LIMIT: usize = 1024;

/// How a [`DynamicExecutable`] specializes.
#[derive(Clone, Copy, Debug)]
pub struct DynamicOptions {
    /// The largest batch compiled as one executable, a power of two of at least 2
    /// (default 8); larger batches run as several chunks.
    pub max_bucket: usize,
    /// The cache a chunk's run-time memory should fit, in bytes: a batch is split into
    /// chunks no larger than the largest bucket whose arena, estimated as its size times
    /// bucket 1's arena, fits it. `None` (default): the size of the CPU's last-level
    /// cache as the OS reports it, 32 MiB where it reports none.
    pub cache_bytes: Option<u64>,
}

impl Default for DynamicOptions {
    fn default() -> Self {
        DynamicOptions {
            max_bucket: 8,
            cache_bytes: None,
        }
    }
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

/// One input as a [`DynamicExecutable`] takes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DynamicInput {
    /// The input's name.
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// Its dims: `None` for the batch (the leading dim of a batched input), the size
    /// otherwise.
    pub dims: Vec<Option<usize>>,
}

impl DynamicInput {
    /// The shape as text, the batch written `N`: `Nx3x224x224`.
    pub fn shape_text(&self) -> String {
        let parts: Vec<String> = self
            .dims
            .iter()
            .map(|d| d.map_or_else(|| "N".to_string(), |n| n.to_string()))
            .collect();
        parts.join("x")
    }

    fn batched(&self) -> bool {
        self.dims.first() == Some(&None)
    }

    /// The concrete dims at batch `n`.
    fn at_batch(&self, n: usize) -> Vec<usize> {
        self.dims.iter().map(|d| d.unwrap_or(n)).collect()
    }

    /// The input's row-major type at batch `n`.
    pub fn type_at(&self, n: usize) -> TensorType {
        TensorType {
            dtype: self.dtype,
            dims: self.at_batch(n),
            layout: smelt_ir::Layout::RowMajor,
        }
    }
}

/// A specialization compiled so far.
#[derive(Clone, Debug, PartialEq)]
pub struct Specialization {
    /// The batch size it was compiled for.
    pub batch: usize,
    /// Milliseconds the compile took (import, passes, code generation).
    pub compile_ms: f64,
    /// The warnings of its optimization (a fusion limit hit, an unchecked rule run).
    pub warnings: Vec<Diagnostic>,
}

/// A model with a dynamic batch, compiled per bucket on first use (see the module doc).
/// Safe to share across threads.
pub struct DynamicExecutable {
    path: PathBuf,
    options: Options,
    inputs: Vec<DynamicInput>,
    /// The results' names.
    outputs: Vec<String>,
    /// One slot per bucket size, ascending: 1, 2, 4, ... up to `max_bucket`.
    buckets: Vec<Bucket>,
    /// The cache a chunk's arena should fit (see [`DynamicOptions::cache_bytes`]).
    cache_bytes: u64,
    /// The batch analysis of the model at batch 2, for splits into chunks of 1 only.
    unit_proof: Mutex<Option<Result<Vec<bool>, Diagnostic>>>,
    /// The model file decoded once, on the first compile: every bucket imports from it,
    /// so the file is read once and the buckets share its weights.
    decoded: Mutex<Option<Arc<DecodedModel>>>,
}

struct Bucket {
    batch: usize,
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
    separable: Option<Result<Vec<bool>, Diagnostic>>,
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
        for d in declared.inputs {
            let dims = match options.load.input_shapes.get(&d.name) {
                Some(pinned) => pinned.iter().map(|&n| Some(n)).collect(),
                None => dynamic_dims(&d.name, d.dims.as_deref())?,
            };
            inputs.push(DynamicInput {
                name: d.name,
                dtype: d.dtype,
                dims,
            });
        }
        if !inputs.iter().any(DynamicInput::batched) {
            return Err(Error::InvalidArgument(format!(
                "{}: no input has a dynamic batch (a dynamic leading dimension); compile it \
                 as an Executable",
                path.display()
            )));
        }
        let buckets = std::iter::successors(Some(1usize), |&b| Some(b * 2))
            .take_while(|&b| b <= dynamic.max_bucket)
            .map(|batch| Bucket {
                batch,
                compiled: Mutex::new(None),
            })
            .collect();
        Ok(DynamicExecutable {
            path: path.to_path_buf(),
            options: options.clone(),
            inputs,
            outputs: declared.outputs,
            buckets,
            cache_bytes: dynamic
                .cache_bytes
                .or_else(last_level_cache_bytes)
                .unwrap_or(DEFAULT_CACHE_BYTES),
            unit_proof: Mutex::new(None),
            decoded: Mutex::new(None),
        })
    }

    /// The inputs, the batch marked.
    pub fn inputs(&self) -> &[DynamicInput] {
        &self.inputs
    }

    /// The bucket sizes, ascending.
    pub fn bucket_sizes(&self) -> Vec<usize> {
        self.buckets.iter().map(|b| b.batch).collect()
    }

    /// The largest chunk a batch is split into: the largest bucket whose run-time memory,
    /// estimated as its size times bucket 1's arena, fits the cache
    /// ([`DynamicOptions::cache_bytes`]); at least 1. Compiles bucket 1 on first use.
    ///
    /// Why: a bucket runs layer by layer over its whole batch, and once a layer's
    /// activations of every element no longer fit the last-level cache each layer streams
    /// them from memory. ResNet-50 on a 32 MiB L3 (arena 9 MB per element) ran at 31.5 ms
    /// per element as batch 1, 29.9 as batch 2 and 36.6 as batch 8 (one thread).
    pub fn largest_chunk(&self) -> Result<usize, Error> {
        let per_element = self.compiled(1)?.exe.arena_bytes().max(1) as u64;
        Ok(self
            .buckets
            .iter()
            .map(|b| b.batch)
            .take_while(|&b| b == 1 || (b as u64).saturating_mul(per_element) <= self.cache_bytes)
            .last()
            .unwrap_or(1))
    }

    /// The chunks a run of `batch` elements is split into, largest first: as many of the
    /// largest chunk ([`DynamicExecutable::largest_chunk`]) as fit, then the binary
    /// digits of the rest (a batch of 7 with largest chunk 8 runs 4, 2 and 1).
    pub fn chunks(&self, batch: usize) -> Result<Vec<usize>, Error> {
        let largest = self.largest_chunk()?;
        let mut left = batch;
        let mut chunks = Vec::new();
        for b in self.buckets.iter().rev().filter(|b| b.batch <= largest) {
            while left >= b.batch {
                chunks.push(b.batch);
                left -= b.batch;
            }
        }
        Ok(chunks)
    }

    /// The specializations compiled so far, by batch.
    pub fn specializations(&self) -> Vec<Specialization> {
        self.buckets
            .iter()
            .filter_map(|b| {
                let slot = b.compiled.lock().ok()?;
                slot.as_ref().map(|c| Specialization {
                    batch: b.batch,
                    compile_ms: c.compile_ms,
                    warnings: c.warnings.clone(),
                })
            })
            .collect()
    }

    /// Compiles every bucket a run of `batch` elements needs (and checks it can be split),
    /// so that the run itself compiles nothing.
    pub fn warm_up(&self, batch: usize) -> Result<(), Error> {
        let chunks = self.chunks(batch)?;
        for &size in &chunks {
            self.compiled(size)?;
        }
        match chunks.first() {
            Some(&largest) if chunks.len() > 1 => self.split_proof(largest).map(drop),
            _ => Ok(()),
        }
    }

    /// Which results carry the batch, proved for a split whose largest chunk is
    /// `largest`: by that bucket's module when it is 2 or more, else by the model loaded
    /// (not compiled) at batch 2, once.
    fn split_proof(&self, largest: usize) -> Result<Vec<bool>, Error> {
        if largest >= 2 {
            return Ok(self.compiled(largest)?.batched()?.to_vec());
        }
        let mut slot = self
            .unit_proof
            .lock()
            .map_err(|_| Error::Unsupported("a batch analysis panicked".into()))?;
        if slot.is_none() {
            let module = self.module_at(2)?;
            *slot = Some(self.separable_results(&module, 2));
        }
        match slot.as_ref() {
            Some(Ok(batched)) => Ok(batched.clone()),
            Some(Err(d)) => Err(Error::from(d.clone())),
            None => Err(Error::Unsupported("no batch analysis".into())),
        }
    }

    /// The model with its batch pinned to `batch` (any size, not only a bucket's), loaded
    /// and verified but not compiled: the reference a run at that batch is checked against.
    pub fn module_at(&self, batch: usize) -> Result<smelt_ir::Module, Error> {
        if batch == 0 {
            return Err(Error::InvalidArgument(
                "the batch must be at least 1".into(),
            ));
        }
        let mut import = self.import_options();
        for input in self.inputs.iter().filter(|i| i.batched()) {
            import
                .input_shapes
                .insert(input.name.clone(), input.at_batch(batch));
        }
        self.decoded()?.import(&import)
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
        let mut slot = self
            .decoded
            .lock()
            .map_err(|_| Error::Unsupported("a model decode panicked".into()))?;
        if let Some(d) = slot.as_ref() {
            return Ok(d.clone());
        }
        let d = Arc::new(decode_file(&self.path, &self.import_options())?);
        *slot = Some(d.clone());
        Ok(d)
    }

    /// The executable of the bucket of `size` elements (one of
    /// [`DynamicExecutable::bucket_sizes`]), compiled on first use: its kernels, arena and
    /// profile are those of every chunk of that size.
    pub fn bucket(&self, size: usize) -> Result<Arc<Executable>, Error> {
        Ok(self.compiled(size)?.exe.clone())
    }

    /// Floating-point operations of a run of `batch` elements, summed over its chunks:
    /// as the model writes them and as the kernels execute them (they differ where
    /// Winograd computes). Compiles the buckets the run needs.
    pub fn flops(&self, batch: usize) -> Result<(u64, u64), Error> {
        self.chunks(batch)?
            .into_iter()
            .try_fold((0, 0), |(written, executed), size| {
                let c = self.compiled(size)?;
                Ok((written + c.flops, executed + c.exe.executed_flops()))
            })
    }

    /// The bucket of `batch` elements (a bucket size), compiled on first use.
    fn compiled(&self, batch: usize) -> Result<Arc<Compiled>, Error> {
        let slot = self
            .buckets
            .iter()
            .find(|b| b.batch == batch)
            .ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "no bucket of batch {batch} (buckets: {:?})",
                    self.bucket_sizes()
                ))
            })?;
        let mut compiled = slot
            .compiled
            .lock()
            .map_err(|_| Error::Unsupported("a bucket's compile panicked".into()))?;
        if let Some(c) = compiled.as_ref() {
            return Ok(c.clone());
        }
        let start = Instant::now();
        let mut opts = self.options.clone();
        let module = self.module_at(batch)?;
        let separable = (batch >= 2).then(|| self.separable_results(&module, batch));
        let flops = module.entry().map_or(0, |f| f.flops());
        // the shapes are pinned in `module` now
        opts.load.input_shapes.clear();
        let (exe, cx) = compile(&module, &opts)?;
        let c = Arc::new(Compiled {
            exe: Arc::new(exe),
            compile_ms: start.elapsed().as_secs_f64() * 1e3,
            flops,
            warnings: cx.warnings,
            separable,
        });
        *compiled = Some(c.clone());
        Ok(c)
    }

    /// Which results of `module` (the model at `batch`) carry the batch.
    fn separable_results(
        &self,
        module: &smelt_ir::Module,
        batch: usize,
    ) -> Result<Vec<bool>, Diagnostic> {
        let func = module.entry().ok_or_else(|| {
            Diagnostic::error(
                "batch-analysis",
                module.no_entry_reason(),
                smelt_ir::Location::Unknown,
            )
        })?;
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
        let axes = batch_axes(func, &params, batch)?;
        leading_results(func, &axes)
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
        self.run_plan(&plan, &ins, &mut outs)?;
        Ok(results)
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
        let n = self.batch_of(input_shapes)?;
        if n != plan.batch {
            return Err(Error::InvalidArgument(format!(
                "the inputs have batch {n}, the plan was made for batch {}",
                plan.batch
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
        let n = self.batch_of(input_shapes)?;
        let sizes = self.chunks(n)?;
        let chunks: Vec<Arc<Compiled>> = sizes
            .iter()
            .map(|&size| self.compiled(size))
            .collect::<Result<_, _>>()?;
        let (first, size) = (&chunks[0], sizes[0]);
        let separable = match chunks.len() {
            // one chunk: the results are the bucket's own
            1 => vec![false; first.exe.outputs().len()],
            // the largest chunk's bucket (2 or more elements) proves the split
            _ => self.split_proof(size)?,
        };
        let results = first
            .exe
            .outputs()
            .zip(&separable)
            .map(|(o, &batched)| scaled(&o.ty, batched, size, n))
            .collect::<Result<_, _>>()?;
        Ok(RunPlan {
            batch: n,
            sizes,
            chunks,
            separable,
            results,
        })
    }

    /// Runs `plan` on checked buffers: each chunk reads contiguous ranges of the batched
    /// inputs and writes contiguous ranges of the batched results.
    fn run_plan(
        &self,
        plan: &RunPlan,
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        let n = plan.batch;
        if let [only] = &plan.chunks[..] {
            return only.exe.run_into(inputs, outputs);
        }
        let mut offset = 0;
        for (compiled, &size) in plan.chunks.iter().zip(&plan.sizes) {
            let exe = &compiled.exe;
            let ins: Vec<Elements<'_>> = inputs
                .iter()
                .zip(&self.inputs)
                .map(|(&e, info)| match info.batched() {
                    true => chunk_of(e, e.len() / n, offset, size),
                    false => Ok(e),
                })
                .collect::<Result<_, _>>()?;
            // an unbatched result is the same for every chunk: the first writes it, the
            // others write scratch copies
            let mut scratch: Vec<Tensor> = match offset {
                0 => Vec::new(),
                _ => exe
                    .outputs()
                    .zip(&plan.separable)
                    .filter(|(_, &batched)| !batched)
                    .map(|(o, _)| Tensor::zeros(&o.ty))
                    .collect(),
            };
            let mut scratch = scratch.iter_mut();
            let mut outs: Vec<ElementsMut<'_>> = Vec::with_capacity(outputs.len());
            for (whole, &batched) in outputs.iter_mut().zip(&plan.separable) {
                let per = whole.len() / n;
                let out = match (batched, offset) {
                    (true, _) => whole.range_mut(offset * per..(offset + size) * per),
                    (false, 0) => whole.range_mut(0..whole.len()),
                    (false, _) => scratch.next().map(|s| ElementsMut::of(&mut s.data)),
                };
                outs.push(out.ok_or_else(|| {
                    Error::Unsupported("a chunk's result does not fit the batch's".into())
                })?);
            }
            exe.run_into(&ins, &mut outs)?;
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

    /// The batch of a run: the shared leading size of the batched inputs, each input's
    /// count, rank and other dims checked.
    fn batch_of(&self, shapes: &[&[usize]]) -> Result<usize, Error> {
        if shapes.len() != self.inputs.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} inputs, got {}",
                self.inputs.len(),
                shapes.len()
            )));
        }
        let mut batch: Option<(usize, &str)> = None;
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
                match want {
                    Some(w) if *w != got => {
                        return Err(Error::InvalidArgument(format!(
                            "input {} dimension {k} must be {w}, got {got} (shape {dims:?})",
                            info.name
                        )))
                    }
                    Some(_) => {}
                    None => match batch {
                        Some((n, first)) if n != got => {
                            return Err(Error::InvalidArgument(format!(
                                "input {} has batch {got} but input {first} has batch {n}: \
                                 the batched inputs share one batch size",
                                info.name
                            )))
                        }
                        Some(_) => {}
                        None => batch = Some((got, &info.name)),
                    },
                }
            }
        }
        match batch {
            Some((0, name)) => Err(Error::InvalidArgument(format!(
                "input {name} has batch 0; a run takes at least one element"
            ))),
            Some((n, _)) => Ok(n),
            None => Err(Error::InvalidArgument("no batched input".into())),
        }
    }
}

/// How a run of one batch goes ([`DynamicExecutable::plan`]): its chunks (largest
/// first) and their compiled buckets, which results carry the batch, and the results'
/// types at the run's batch. Made once, it runs any number of times.
pub struct RunPlan {
    batch: usize,
    sizes: Vec<usize>,
    chunks: Vec<Arc<Compiled>>,
    separable: Vec<bool>,
    results: Vec<TensorType>,
}

impl RunPlan {
    /// The batch it runs.
    pub fn batch(&self) -> usize {
        self.batch
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

/// The dims of a declared input: the leading dynamic dim is the batch; any other
/// dynamic dim must be pinned.
fn dynamic_dims(name: &str, dims: Option<&[InputDim]>) -> Result<Vec<Option<usize>>, Error> {
    let dims = dims.ok_or_else(|| {
        Error::InvalidArgument(format!(
            "input '{name}' declares no shape; pin it with its whole shape"
        ))
    })?;
    dims.iter()
        .enumerate()
        .map(|(k, d)| match d {
            InputDim::Fixed(n) => Ok(Some(*n)),
            InputDim::Dynamic(_) if k == 0 => Ok(None),
            InputDim::Dynamic(p) => Err(Error::InvalidArgument(format!(
                "input '{name}' dimension {k} is dynamic ({}); only a leading batch may stay \
                 dynamic: pin the input's whole shape",
                if p.is_empty() { "-1" } else { p }
            ))),
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
