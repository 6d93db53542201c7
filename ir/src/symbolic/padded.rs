//! Running a function whose image sizes are symbols at a larger *bucket* of sizes (issue
//! #23): the inputs padded with zeros to the bucket, the results cropped to the sizes
//! their symbolic types give at the real sizes. That is exact when every value that an
//! op reads across its spatial border holds zeros past its real extent, the way the op's
//! own zero padding would: [`pad_images`] multiplies each such value by a *mask* input
//! (1 on the real extent, 0 past it), and rescales each global average pool of a padded
//! value by a *scale* input (the bucket's area over the real one).
//!
//! A value is *padded* when it has rank 4 and a symbolic height or width. Its readers:
//!
//! - **pointwise** ops (unary, binary, comparisons, logic, `where`, casts, batch norm, a
//!   concat along the channels) compute each position from the same positions of their
//!   operands: what they leave past the real extent is never read unmasked;
//! - **window** ops read across the border: a conv or transposed conv (zero padding:
//!   exact once its input is masked), a max pool without padding and floor rounding (its
//!   real outputs read only real inputs), an average pool without padding or counting its
//!   padding, a zero `pad`, a global average pool (a sum over the masked plane, then the
//!   scale). Their operands are masked;
//! - a **nearest resize by a whole factor** (`2*"height/32"` from `"height/32"`) reads
//!   `floor(o / k)`, and a **1×1 conv without padding** reads `o·s`: inside the real
//!   extent for every real output, so no mask;
//! - anything else (a reshape or transpose that moves H or W, a reduction or softmax over
//!   them, a bilinear resize or one to sizes read from another value, a max pool whose
//!   padding is −∞, a crop) is refused, naming the instruction.
//!
//! The assumption is the padding proof's: the function computes finite values at padded
//! positions (they are multiplied by 0).

use crate::diag::Diagnostic;
use crate::graph::{Func, FuncResult, Inst, Param, Value, ValueDef};
use crate::op::{BinaryOp, CoordinateMode, Dim, Op, PadMode, ResizeMode};
use crate::types::{DType, TensorType};

/// The diagnostic code of a function [`pad_images`] refuses.
pub const NOT_IMAGE_PADDABLE: &str = "not-image-paddable";

/// A function prepared to run at a bucket's sizes (see the module doc).
#[derive(Clone, Debug)]
pub struct PaddedFunc {
    /// The function: the original's parameters, then one `[1, 1, h, w]` f32 mask per
    /// entry of `masks`, then one `[1]` f32 scale per entry of `scales`; its results are
    /// the original's, to be cropped.
    pub func: Func,
    /// The symbolic `[h, w]` of each mask parameter, in parameter order: at a run it
    /// holds 1 where both indices are below these sizes at the real symbols, else 0.
    pub masks: Vec<[Dim; 2]>,
    /// The symbolic `[h, w]` each scale parameter corrects: at a run it holds
    /// `(h·w at the bucket) / (h·w at the real symbols)`.
    pub scales: Vec<[Dim; 2]>,
}

impl PaddedFunc {
    /// The mask and scale inputs of a run at the symbols' values `real` padded to
    /// `bucket` (each mask `[1, 1, h, w]` at the bucket's sizes, 1 where both indices are
    /// below the real sizes; each scale the bucket's area over the real one), in
    /// parameter order; an error names a size the bindings cannot give.
    pub fn extra_inputs(
        &self,
        real: &super::Bindings,
        bucket: &super::Bindings,
    ) -> Result<Vec<crate::Tensor>, String> {
        let at = |d: Dim, b| super::size_at(d.stored(), b);
        let mut inputs = Vec::with_capacity(self.masks.len() + self.scales.len());
        for &[h, w] in &self.masks {
            let (hb, wb, hr, wr) = (at(h, bucket)?, at(w, bucket)?, at(h, real)?, at(w, real)?);
            let data = (0..hb * wb)
                .map(|i| f32::from(u8::from(i / wb < hr && i % wb < wr)))
                .collect();
            inputs.push(crate::Tensor {
                ty: TensorType::f32(vec![1, 1, hb, wb]),
                data: crate::TensorData::F32(data),
            });
        }
        for &[h, w] in &self.scales {
            let area = |b| -> Result<f32, String> { Ok((at(h, b)? * at(w, b)?) as f32) };
            let (real_area, bucket_area) = (area(real)?, area(bucket)?);
            if real_area == 0.0 {
                return Err(format!("an image plane of {h}x{w} is empty at these sizes"));
            }
            inputs.push(crate::Tensor {
                ty: TensorType::f32(vec![1]),
                data: crate::TensorData::F32(vec![bucket_area / real_area]),
            });
        }
        Ok(inputs)
    }
}

/// The symbolic `[h, w]` of a padded value's type, or `None`.
fn spatial(t: &TensorType) -> Option<[Dim; 2]> {
    if t.rank() != 4 || !t.is_symbolic() {
        return None;
    }
    let [h, w] = [Dim::from_stored(t.dims[2]), Dim::from_stored(t.dims[3])];
    (h.known_size().is_none() || w.known_size().is_none()).then_some([h, w])
}

/// How an op reads a padded operand.
enum Reads {
    /// Position by position.
    Pointwise,
    /// Across the border: the operand is masked first.
    Window,
    /// A global average pool: masked, and its result rescaled.
    GlobalAverage,
    /// Inside the real extent only.
    Inside,
}

/// How `inst` (of `f`) reads its operand `k` of type `t`, a padded value; `Err` names
/// why it cannot run padded.
fn reads(f: &Func, inst: &Inst, k: usize, t: &TensorType) -> Result<Reads, String> {
    let (op, out) = (&inst.op, &inst.ty);
    let name = op.name();
    // a 1×1 window without padding reads its own pixel (`o·s`, inside the real extent
    // for every real output)
    let one_by_one = |pads: &[usize; 4]| {
        *pads == [0; 4]
            && inst
                .operands
                .get(1)
                .is_some_and(|&w| f.type_of(w).dims.get(2..) == Some(&[1, 1][..]))
    };
    Ok(match op {
        Op::Unary(_)
        | Op::Binary(_)
        | Op::Compare(_)
        | Op::Logic(_)
        | Op::Not
        | Op::Where
        | Op::Cast { .. }
        | Op::Mod { .. }
        | Op::BatchNorm { .. } => Reads::Pointwise,
        Op::Concat { axis } if *axis < 2 => Reads::Pointwise,
        Op::Conv2d(a) if k == 0 && one_by_one(&a.pads) => Reads::Inside,
        Op::Conv2d(_) | Op::ConvTranspose2d(_) if k == 0 => Reads::Window,
        Op::MaxPool2d(p) if p.pads == [0; 4] && !p.ceil_mode => Reads::Window,
        Op::AvgPool2d {
            pool,
            count_include_pad,
        } if !pool.ceil_mode && (*count_include_pad || pool.pads == [0; 4]) => Reads::Window,
        Op::GlobalAvgPool => Reads::GlobalAverage,
        // zeros only (a fill operand may be another value), and no crop
        Op::Pad(p)
            if p.mode == PadMode::Constant
                && inst.operands.len() == 1
                && p.pads.iter().all(|&n| n >= 0) =>
        {
            Reads::Window
        }
        // the source of a real output is inside the real extent, and the same at every
        // size, when the factor is whole and the transform does not depend on the sizes
        Op::Resize(r)
            if matches!(r.mode, ResizeMode::Nearest(_))
                && matches!(
                    r.coordinate,
                    CoordinateMode::Asymmetric
                        | CoordinateMode::HalfPixel
                        | CoordinateMode::PytorchHalfPixel
                )
                && whole_factors(t, out) =>
        {
            Reads::Inside
        }
        Op::MaxPool2d(_) => {
            return Err(format!(
                "'{name}' with padding or ceil rounding pads with -inf, not the zeros a \
                 padded run holds"
            ))
        }
        Op::AvgPool2d { .. } => {
            return Err(format!(
                "'{name}' that leaves its padding out of the count divides by the real \
                 window"
            ))
        }
        Op::Resize(_) => {
            return Err(format!(
                "'{name}' other than a nearest one by a whole factor reads the real edge \
                 at the border"
            ))
        }
        _ => return Err(format!("'{name}' reads across the height or width")),
    })
}

/// Whether every axis of `out` is its axis of `t` times a whole factor (1 to 16).
fn whole_factors(t: &TensorType, out: &TensorType) -> bool {
    t.rank() == out.rank()
        && t.dims.iter().zip(&out.dims).all(|(&a, &b)| {
            let (a, b) = (Dim::from_stored(a), Dim::from_stored(b));
            (1..=16).any(|k| a * k == b)
        })
}

/// `f` prepared to run padded to a bucket's sizes, or a diagnostic naming the first
/// instruction that cannot (see the module doc). A function without padded values gets
/// no masks.
pub fn pad_images(f: &Func) -> Result<PaddedFunc, Diagnostic> {
    let refuse = |why: String, loc: &crate::diag::Location| {
        Diagnostic::error(NOT_IMAGE_PADDABLE, why, loc.clone())
    };
    // what each instruction's result is multiplied by: a mask of its own spatial sizes
    // (a window reads it; the inputs need none, the caller pads them with zeros), or the
    // scale of a global average pool's input sizes
    let mut factor: Vec<Option<Factor>> = vec![None; f.insts.len()];
    for (i, inst) in f.insts.iter().enumerate() {
        for (k, &v) in inst.operands.iter().enumerate() {
            let t = f.type_of(v);
            let Some(sizes) = spatial(t) else {
                continue;
            };
            let read = reads(f, inst, k, t).map_err(|why| refuse(why, &inst.loc))?;
            if matches!(read, Reads::Pointwise | Reads::Inside) {
                continue;
            }
            if t.dtype != DType::F32 {
                return Err(refuse(
                    format!("a padded {} value is read across its border", t.dtype),
                    &inst.loc,
                ));
            }
            if let Some(ValueDef::Inst(j)) = f.def(v) {
                factor[j] = Some(Factor::Mask(sizes));
            }
            if let Reads::GlobalAverage = read {
                factor[i] = Some(Factor::Scale(sizes));
            }
        }
    }
    // one parameter per distinct size of each kind, in definition order
    let (mut masks, mut scales): (Vec<[Dim; 2]>, Vec<[Dim; 2]>) = (Vec::new(), Vec::new());
    let slot = |list: &mut Vec<[Dim; 2]>, s: [Dim; 2]| match list.iter().position(|&x| x == s) {
        Some(k) => k,
        None => {
            list.push(s);
            list.len() - 1
        }
    };
    let slots: Vec<Option<Factor<usize>>> = factor
        .iter()
        .map(|fa| match *fa {
            Some(Factor::Mask(s)) => Some(Factor::Mask(slot(&mut masks, s))),
            Some(Factor::Scale(s)) => Some(Factor::Scale(slot(&mut scales, s))),
            None => None,
        })
        .collect();
    let unique = |base: &str, k: usize| {
        let mut name = format!("{base}{k}");
        while f.params.iter().any(|p| p.name == name) {
            name.push('_');
        }
        name
    };
    let mut params = f.params.clone();
    for (k, s) in masks.iter().enumerate() {
        params.push(Param {
            name: unique("image_mask", k),
            ty: TensorType::new(
                DType::F32,
                Dim::stored_all(&[Dim::known(1), Dim::known(1), s[0], s[1]]),
            ),
        });
    }
    for k in 0..scales.len() {
        params.push(Param {
            name: unique("image_scale", k),
            ty: TensorType::f32(vec![1]),
        });
    }
    let (first_mask, first_scale) = (f.params.len(), f.params.len() + masks.len());
    // old value -> new value: each instruction, then the mul by its factor
    let mut new_of: Vec<Value> = (0..f.params.len()).map(|p| Value(p as u32)).collect();
    let mut insts: Vec<Inst> = Vec::with_capacity(f.insts.len());
    let next = |insts: &Vec<Inst>| Value((params.len() + insts.len()) as u32);
    for (inst, slot) in f.insts.iter().zip(&slots) {
        let mut copy = inst.clone();
        copy.operands = inst.operands.iter().map(|v| new_of[v.index()]).collect();
        let mut result = next(&insts);
        insts.push(copy);
        let param = match *slot {
            Some(Factor::Mask(k)) => Some(first_mask + k),
            Some(Factor::Scale(k)) => Some(first_scale + k),
            None => None,
        };
        if let Some(param) = param {
            let product = next(&insts);
            insts.push(Inst {
                op: Op::Binary(BinaryOp::Mul),
                operands: vec![result, Value(param as u32)],
                ty: inst.ty.clone(),
                loc: inst.loc.clone(),
            });
            result = product;
        }
        new_of.push(result);
    }
    let results = f
        .results
        .iter()
        .map(|r| FuncResult {
            name: r.name.clone(),
            value: new_of[r.value.index()],
        })
        .collect();
    Ok(PaddedFunc {
        func: Func {
            name: f.name.clone(),
            params,
            insts,
            results,
            loc: f.loc.clone(),
        },
        masks,
        scales,
    })
}

/// What a result is multiplied by: a mask or a scale, of spatial sizes `T` (then of a
/// parameter slot).
#[derive(Clone, Copy)]
enum Factor<T = [Dim; 2]> {
    Mask(T),
    Scale(T),
}
