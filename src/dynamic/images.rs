//! Image sizes padded to buckets: a model whose dynamic sizes are image sides (two or
//! more symbols off the leading axis, no batch or sequence) runs each size at the
//! smallest *image bucket* at least as large on every side, its inputs padded with
//! zeros and its results cropped. The model imported with symbolic sizes is prepared
//! once by [`smelt_ir::symbolic::pad_images`] (every value a window op reads across its
//! border multiplied by a mask input, global average pools rescaled) and fused once;
//! each bucket specializes it and compiles, and a run fills the masks for its real
//! sizes. A model `pad_images` refuses (a bilinear resize to the input's size, a max pool
//! with padding), or sizes no bucket of the ladder can take (DBNet needs multiples of
//! 32), compile each set of sizes exactly, as before.
//!
//! Policy: the ladder is `m·2^e` for `m` in 4..=7 (…, 256, 320, 384, 448, 512, 640, …): a
//! side pads by less than a quarter past 4. At most [`DynamicOptions::max_shapes`]
//! buckets keep their executables, the least recently run dropped first;
//! [`DynamicOptions::image_buckets`] `false` compiles every size exactly.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use smelt_ir::symbolic::{bind_symbols, pad_images, size_at, specialize, Bindings, PaddedFunc};
use smelt_ir::{Diagnostic, Func, Module, Tensor, TensorType};

use super::{DynamicDim, DynamicExecutable, RunPlan};
use crate::driver::optimize;
use crate::runtime::{copy_common_box, Elements, ElementsMut, Executable};
use crate::Error;

/// The `step`-th size of the image-bucket ladder (`m·2^e`, `m` in 4..=7) at least `v`.
pub fn image_bucket(v: usize, step: usize) -> usize {
    let mut ladder = (0..usize::BITS - 3).flat_map(|e| (4..8).map(move |m| m << e));
    ladder
        .by_ref()
        .find(|&b| b >= v)
        .and_then(|first| match step {
            0 => Some(first),
            _ => ladder.nth(step - 1),
        })
        .unwrap_or(v)
}

/// How many ladder steps past the first a bucket may be tried at, for a model whose
/// symbols only take some sizes (multiples of 32).
const BUCKET_TRIES: usize = 4;

/// The model prepared for padded runs, or why it cannot be.
pub(super) struct ImagePadding {
    pub(super) model: Result<PaddedModel, String>,
}

/// The model with masks, fused once, and the buckets compiled from it.
pub(super) struct PaddedModel {
    /// The symbolic import's entry: what the real and bucket sizes bind.
    entry: Func,
    padded: PaddedFunc,
    /// `padded` in the model, after the pass pipeline.
    optimized: Module,
    warnings: Vec<Diagnostic>,
    /// The buckets run so far, least recently run first; each compiles under its own
    /// lock, so runs of other buckets go on meanwhile.
    buckets: Mutex<Vec<(Vec<usize>, Arc<PaddedBucket>)>>,
}

/// One bucket (kept by its symbols' values, in [`DynamicExecutable::symbols`] order):
/// its executable once compiled, and the masks and scales of the real sizes run in it
/// lately.
#[derive(Default)]
pub(super) struct PaddedBucket {
    compiled: Mutex<Option<Arc<CompiledBucket>>>,
    /// Masks and scales by the real symbol values they are for, newest last (at most
    /// [`EXTRAS_KEPT`]): a run at a size seen lately builds none.
    extras: Mutex<Vec<(Vec<usize>, Extras)>>,
}

/// A run's masks and scales, in parameter order.
type Extras = Arc<Vec<Tensor>>;

/// How many sets of masks and scales a bucket keeps.
const EXTRAS_KEPT: usize = 4;

/// A bucket's executable.
pub(super) struct CompiledBucket {
    exe: Executable,
    /// Bucket-sized inputs and results of runs done, each a `Vec` of the inputs then the
    /// results, for the next runs to reuse: fresh memory costs page clearing on every
    /// run (≈ 5 MB for DBNet at 640×512).
    scratch: Mutex<Vec<Vec<Tensor>>>,
    compile_ms: f64,
    warnings: Vec<Diagnostic>,
}

/// A padded run's bucket: its executable, the inputs' and results' dims there, and the
/// masks and scales of the run's real sizes.
pub struct PaddedRun {
    bucket: Arc<CompiledBucket>,
    /// The inputs' real dims the plan was made for (its masks are theirs).
    real_inputs: Vec<Vec<usize>>,
    input_dims: Vec<Vec<usize>>,
    result_dims: Vec<Vec<usize>>,
    extras: Extras,
}

impl PaddedBucket {
    /// The masks and scales of a run at the real symbol values `real`, made by `make`
    /// unless one of the last few runs had them.
    fn extras_for(
        &self,
        real: &[usize],
        make: impl FnOnce() -> Result<Vec<Tensor>, String>,
    ) -> Result<Extras, Error> {
        let mut kept = self
            .extras
            .lock()
            .map_err(|_| Error::Unsupported("a mask build panicked".into()))?;
        super::recently_used(&mut kept, &real.to_vec(), EXTRAS_KEPT, || {
            Ok(Arc::new(make().map_err(Error::InvalidArgument)?))
        })
    }
}

impl PaddedModel {
    /// The buckets compiled so far, least recently run first.
    pub(super) fn specializations(&self) -> Vec<super::Specialization> {
        let Ok(buckets) = self.buckets.lock() else {
            return Vec::new();
        };
        buckets
            .iter()
            .filter_map(|(values, b)| {
                let compiled = b.compiled.lock().ok()?.clone()?;
                Some(super::Specialization {
                    batch: 1,
                    length: None,
                    symbols: values.clone(),
                    compile_ms: compiled.compile_ms,
                    warnings: compiled.warnings.clone(),
                    copies: None,
                    valid_rows: None,
                })
            })
            .collect()
    }
}

impl DynamicExecutable {
    /// The model prepared for padded runs, made on first use; `None` for an executable
    /// that compiles its sizes exactly (see the module doc).
    pub(super) fn image_padding(&self) -> Result<Option<Arc<ImagePadding>>, Error> {
        if !self.pads_images {
            return Ok(None);
        }
        super::made_once(&self.image_padding, "an image padding", || {
            self.prepare_padding()
        })
        .map(Some)
    }

    /// [`DynamicExecutable::image_padding`]'s make.
    fn prepare_padding(&self) -> Result<ImagePadding, Error> {
        let template = self.template()?;
        let model = match &template.modules {
            Err(why) => Err(why.clone()),
            Ok(t) => (|| {
                let entry = t
                    .imported
                    .entry()
                    .ok_or_else(|| t.imported.no_entry_reason())?
                    .clone();
                let padded = pad_images(&entry).map_err(|d| d.to_string())?;
                let mut optimized = t.imported.clone();
                for f in &mut optimized.funcs {
                    if f.name == entry.name {
                        *f = padded.func.clone();
                    }
                }
                let cx = optimize(&mut optimized, &self.options.optimize, None)
                    .map_err(|e| e.to_string())?;
                Ok(PaddedModel {
                    entry,
                    padded,
                    optimized,
                    warnings: cx.warnings,
                    buckets: Mutex::new(Vec::new()),
                })
            })(),
        };
        Ok(ImagePadding { model })
    }

    /// The plan of a padded run of inputs of `shapes`, or `None` when this model or these
    /// sizes compile exactly (the caller then does).
    pub(super) fn plan_padded(&self, shapes: &[&[usize]]) -> Result<Option<RunPlan>, Error> {
        let Some(padding) = self.image_padding()? else {
            return Ok(None);
        };
        let Ok(model) = &padding.model else {
            return Ok(None);
        };
        let values = self.symbol_values(shapes)?;
        let named = |dims_of: &dyn Fn(usize) -> Vec<usize>| -> BTreeMap<String, Vec<usize>> {
            (0..self.inputs.len())
                .map(|k| (self.inputs[k].name.clone(), dims_of(k)))
                .collect()
        };
        let real_shapes = named(&|k| shapes[k].to_vec());
        // sizes the symbolic model cannot take are the exact path's to refuse or import
        let Ok(real) = bind_symbols(&model.entry, &real_shapes) else {
            return Ok(None);
        };
        // each input's dims with the symbols at `bucket`
        let dims_at_values = |bucket: &[usize]| -> Vec<Vec<usize>> {
            self.inputs
                .iter()
                .map(|i| {
                    i.dims
                        .iter()
                        .map(|d| match *d {
                            DynamicDim::Symbol(s) => bucket[s],
                            DynamicDim::Fixed(n) => n,
                            DynamicDim::Batch | DynamicDim::Sequence => 1,
                        })
                        .collect()
                })
                .collect()
        };
        let found = (0..BUCKET_TRIES).find_map(|step| {
            let bucket: Vec<usize> = values.iter().map(|&v| image_bucket(v, step)).collect();
            let dims = dims_at_values(&bucket);
            let shapes = named(&|k| dims[k].clone());
            bind_symbols(&model.entry, &shapes)
                .ok()
                .map(|b| (bucket, dims, shapes, b))
        });
        let Some((bucket, input_dims, bucket_shapes, bound)) = found else {
            return Ok(None);
        };
        let slot = self.bucket_slot(model, &bucket)?;
        let extras = slot.extras_for(&values, || model.padded.extra_inputs(&real, &bound))?;
        let compiled = super::made_once(&slot.compiled, "a bucket's compile", || {
            self.compile_padded(model, &bucket_shapes, &extras)
        })?;
        let dims_at = |b: &Bindings| -> Result<Vec<Vec<usize>>, Error> {
            model
                .entry
                .results
                .iter()
                .map(|r| {
                    let ty = model.entry.type_of(r.value);
                    ty.dims
                        .iter()
                        .map(|&d| size_at(d, b).map_err(Error::InvalidArgument))
                        .collect()
                })
                .collect()
        };
        let real_dims = dims_at(&real)?;
        let results = model
            .entry
            .results
            .iter()
            .zip(&real_dims)
            .map(|(r, dims)| TensorType::new(model.entry.type_of(r.value).dtype, dims.clone()))
            .collect();
        let run = PaddedRun {
            bucket: compiled,
            real_inputs: shapes.iter().map(|s| s.to_vec()).collect(),
            input_dims,
            result_dims: dims_at(&bound)?,
            extras,
        };
        Ok(Some(RunPlan {
            batch: 1,
            length: None,
            sizes: Vec::new(),
            chunks: Vec::new(),
            separable: Vec::new(),
            results,
            shaped: None,
            padded: Some(Arc::new(run)),
        }))
    }

    /// The slot of `bucket` (symbol values), made on first use and kept among the
    /// newest `max_shapes`.
    fn bucket_slot(
        &self,
        model: &PaddedModel,
        bucket: &[usize],
    ) -> Result<Arc<PaddedBucket>, Error> {
        let mut buckets = model
            .buckets
            .lock()
            .map_err(|_| Error::Unsupported("a bucket's compile panicked".into()))?;
        super::recently_used(
            &mut buckets,
            &bucket.to_vec(),
            self.dynamic.max_shapes,
            || Ok(Arc::default()),
        )
    }

    /// The bucket's executable: the padded model specialized at the inputs' `shapes`
    /// and the `extras`' dims, compiled.
    fn compile_padded(
        &self,
        model: &PaddedModel,
        shapes: &BTreeMap<String, Vec<usize>>,
        extras: &[Tensor],
    ) -> Result<CompiledBucket, Error> {
        let start = Instant::now();
        let mut all = shapes.clone();
        let first_extra = model.entry.params.len();
        for (param, t) in model.padded.func.params[first_extra..].iter().zip(extras) {
            all.insert(param.name.clone(), t.ty.dims.clone());
        }
        let module = specialize(&model.optimized, &all)?;
        let exe =
            Executable::compile_sharing(&module, None, &self.constants, &self.options.compile)?;
        Ok(CompiledBucket {
            exe,
            scratch: Mutex::new(Vec::new()),
            compile_ms: start.elapsed().as_secs_f64() * 1e3,
            warnings: model.warnings.clone(),
        })
    }

    /// Runs a padded plan: each input copied into zeros of its bucket's dims, the masks
    /// and scales after them, each result's real box copied out of the bucket's.
    pub(super) fn run_padded(
        &self,
        run: &PaddedRun,
        results: &[TensorType],
        input_shapes: &[&[usize]],
        inputs: &[Elements<'_>],
        outputs: &mut [ElementsMut<'_>],
    ) -> Result<(), Error> {
        if input_shapes
            .iter()
            .map(|s| s.to_vec())
            .ne(run.real_inputs.iter().cloned())
        {
            return Err(Error::InvalidArgument(format!(
                "the inputs have shapes {input_shapes:?}, the plan was made for {:?}",
                run.real_inputs
            )));
        }
        if inputs.len() != self.inputs.len() || outputs.len() != results.len() {
            return Err(Error::InvalidArgument(format!(
                "expected {} inputs and {} outputs, got {} and {}",
                self.inputs.len(),
                results.len(),
                inputs.len(),
                outputs.len()
            )));
        }
        let reused = run
            .bucket
            .scratch
            .lock()
            .ok()
            .and_then(|mut pool| pool.pop());
        let mut set = match reused {
            // the padding past a smaller image of an earlier run must be zeros again
            Some(mut set) => {
                for t in &mut set[..inputs.len()] {
                    t.data.fill_zero();
                }
                set
            }
            None => self
                .inputs
                .iter()
                .zip(&run.input_dims)
                .map(|(info, dims)| (info.dtype, dims))
                .chain(
                    results
                        .iter()
                        .zip(&run.result_dims)
                        .map(|(ty, d)| (ty.dtype, d)),
                )
                .map(|(dtype, dims)| Tensor::zeros(&TensorType::new(dtype, dims.clone())))
                .collect(),
        };
        let (padded, scratch) = set.split_at_mut(inputs.len());
        for ((whole, e), (info, shape)) in padded
            .iter_mut()
            .zip(inputs)
            .zip(self.inputs.iter().zip(input_shapes))
        {
            let dims = whole.ty.dims.clone();
            copy_common_box(*e, shape, &mut ElementsMut::of(&mut whole.data), &dims)
                .map_err(|m| Error::InvalidArgument(format!("input {}: {m}", info.name)))?;
        }
        let ins: Vec<Elements<'_>> = padded
            .iter()
            .chain(run.extras.iter())
            .map(|t| Elements::of(&t.data))
            .collect();
        let mut outs: Vec<ElementsMut<'_>> = scratch
            .iter_mut()
            .map(|t| ElementsMut::of(&mut t.data))
            .collect();
        run.bucket.exe.run_into(&ins, &mut outs)?;
        for ((full, ty), out) in scratch.iter().zip(results).zip(outputs.iter_mut()) {
            copy_common_box(Elements::of(&full.data), &full.ty.dims, out, &ty.dims)
                .map_err(Error::Unsupported)?;
        }
        if let Ok(mut pool) = run.bucket.scratch.lock() {
            // as many sets as runs at once, at most one per thread a run may use
            if pool.len() < 4 {
                pool.push(set);
            }
        }
        Ok(())
    }
}
