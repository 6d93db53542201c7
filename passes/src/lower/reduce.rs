//! Lowering of the reductions (`reduce_sum`, `reduce_mean`, `reduce_max`, `reduce_min`):
//! loops over the kept axes around loops over the reduced ones, accumulating in a
//! register; a reduction over the trailing axes (the layer-norm statistics exporters
//! write out) walks them as one contiguous run in f32x4 vectors.

use smelt_ir::loops::{Access, Affine, BinOp, Expr, KernelBuilder, LoopVar, ReduceOp, Width};
use smelt_ir::op::{ReduceAttrs, Reduction};
use smelt_ir::{Diagnostic, TensorType, Value};

use super::elementwise::{dims_name, loop_nest, row_major_strides, Epilogue};
use super::{BufferId, Cx};

/// `Σ strides[k] · vars[k]`.
fn address(strides: &[i64], vars: &[LoopVar]) -> Affine {
    strides
        .iter()
        .zip(vars)
        .fold(Affine::constant(0), |acc, (&s, &v)| {
            acc.add(&Affine::var(v).scale(s))
        })
}

/// The accumulator's start value and how it takes in one more element.
fn start_and_step(r: Reduction) -> (f32, BinOp) {
    match r {
        Reduction::Sum | Reduction::Mean => (0.0, BinOp::Add),
        Reduction::Max => (f32::NEG_INFINITY, BinOp::Max),
        Reduction::Min => (f32::INFINITY, BinOp::Min),
    }
}

/// `r` of operand 0 over `attrs.axes` into `out`.
pub(crate) fn lower_reduce(
    cx: &mut Cx,
    r: Reduction,
    attrs: &ReduceAttrs,
    operands: &[Value],
    _out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if !epi.is_empty() {
        return Err(cx.unsupported("post-ops on a reduction"));
    }
    let in_dims = cx.func.type_of(operands[0]).dims.clone();
    let rank = in_dims.len();
    let strides = row_major_strides(&in_dims);
    let (kept, reduced): (Vec<usize>, Vec<usize>) =
        (0..rank).partition(|k| !attrs.axes.contains(k));
    let count: usize = reduced.iter().map(|&k| in_dims[k]).product();
    let kept_dims: Vec<usize> = kept.iter().map(|&k| in_dims[k]).collect();
    let kept_strides: Vec<i64> = kept.iter().map(|&k| strides[k]).collect();
    let out_strides = row_major_strides(&kept_dims);
    // the reduced axes are the trailing ones: one contiguous run per result element
    let trailing = reduced
        .iter()
        .enumerate()
        .all(|(i, &k)| k == rank - reduced.len() + i);
    let mut b = KernelBuilder::new(&format!("{}_{}", r.name(), dims_name(&in_dims)));
    let x_buf = cx.buf(operands[0]);
    let x = b.arg("x", cx.len_of(x_buf), Access::Read);
    let y = b.arg("out", cx.len_of(out), Access::Write);
    let (start, step) = start_and_step(r);
    // the mean of nothing is 0 (onnxruntime's value; ONNX leaves it undefined): the sum
    // of nothing, scaled by 0 rather than by 1/0
    let scale = (r == Reduction::Mean).then(|| {
        if count == 0 {
            0.0
        } else {
            (1.0f64 / count as f64) as f32
        }
    });
    let reduced_dims: Vec<usize> = reduced.iter().map(|&k| in_dims[k]).collect();
    let reduced_strides: Vec<i64> = reduced.iter().map(|&k| strides[k]).collect();
    // a vector lane reduction exists for sums and maxima
    let vector = trailing && count >= 8 && r != Reduction::Min;
    loop_nest(&mut b, &kept_dims, &mut |b, outer| {
        let base = address(&kept_strides, outer);
        let acc = b.var(Width::Scalar);
        b.assign(acc, Expr::constant(start, Width::Scalar));
        if vector {
            let lanes = b.var(Width::F32x4);
            b.assign(lanes, Expr::constant(start, Width::F32x4));
            let main = (count / 4 * 4) as i64;
            b.for_loop(0, main, 4, |b, i| {
                let v = Expr::load(x, base.add(&Affine::var(i)), Width::F32x4);
                b.assign(lanes, Expr::binary(step, Expr::Var(lanes), v));
            });
            let horizontal = match r {
                Reduction::Max => ReduceOp::Max,
                _ => ReduceOp::Add,
            };
            b.assign(acc, Expr::Reduce(horizontal, Box::new(Expr::Var(lanes))));
            b.for_loop(main, count as i64, 1, |b, i| {
                let v = Expr::load(x, base.add(&Affine::var(i)), Width::Scalar);
                b.assign(acc, Expr::binary(step, Expr::Var(acc), v));
            });
        } else {
            loop_nest(b, &reduced_dims, &mut |b, inner| {
                let at = base.add(&address(&reduced_strides, inner));
                let v = Expr::load(x, at, Width::Scalar);
                b.assign(acc, Expr::binary(step, Expr::Var(acc), v));
            });
        }
        let value = match scale {
            Some(s) => Expr::binary(BinOp::Mul, Expr::Var(acc), Expr::constant(s, Width::Scalar)),
            None => Expr::Var(acc),
        };
        b.store(y, address(&out_strides, outer), value, Width::Scalar);
    });
    cx.step(b.finish(), vec![x_buf, out])
}
