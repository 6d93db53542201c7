//! Lowering of `resize`: each resized axis gets compile-time tables of the input offsets
//! (index times stride) and weights its output indices read ([`ResizeAttrs::taps`], the
//! interpreter's too), and the kernel sums table entries into a run-time offset read by
//! `LoadAt` — a data-dependent address whose bound the checker proves and the generated
//! code tests, so even a wrong table could never read outside the input.

use smelt_ir::loops::{Access, Affine, BinOp, Expr, KernelBuilder, Width};
use smelt_ir::op::{ResizeAttrs, ResizeMode};
use smelt_ir::{DType, Diagnostic, TensorData, TensorType, Value};

use super::elementwise::{dims_name, loop_nest, row_major_strides, Epilogue};
use super::{BufferId, Cx};

/// `r` of operand 0 into `out`.
pub(crate) fn lower_resize(
    cx: &mut Cx,
    r: &ResizeAttrs,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if !epi.is_empty() {
        return Err(cx.unsupported("post-ops on a resize"));
    }
    let in_dims = cx.func.type_of(operands[0]).dims.clone();
    let rank = in_dims.len();
    let strides = row_major_strides(&in_dims);
    let out_strides = row_major_strides(&out_ty.dims);
    let resized: Vec<usize> = (0..rank).filter(|&k| r.resizes(k, &in_dims)).collect();
    let mut b = KernelBuilder::new(&format!("resize_{}", dims_name(&out_ty.dims)));
    let x_buf = cx.buf(operands[0]);
    let dtype = cx.dtype_of(x_buf);
    let x = b.typed_arg("x", dtype, cx.len_of(x_buf), Access::Read);
    let mut args = vec![x_buf];
    // per resized axis: offsets of the low and high taps, and the high tap's weight
    let mut tables = Vec::new();
    for &k in &resized {
        let taps = r.taps(k, in_dims[k]);
        let offsets = |pick: fn(&smelt_ir::op::Taps) -> usize| {
            TensorData::I64(taps.iter().map(|t| (pick(t) as i64) * strides[k]).collect())
        };
        let lo = cx.typed_constant(&format!("resize_lo{k}"), &offsets(|t| t.lo));
        let lo_arg = b.typed_arg(&format!("lo{k}"), DType::I64, taps.len(), Access::Read);
        args.push(lo);
        let linear = match r.mode {
            ResizeMode::Nearest(_) => None,
            ResizeMode::Linear => {
                let hi = cx.typed_constant(&format!("resize_hi{k}"), &offsets(|t| t.hi));
                let hi_arg = b.typed_arg(&format!("hi{k}"), DType::I64, taps.len(), Access::Read);
                let w = cx.constant(
                    &format!("resize_w{k}"),
                    &taps.iter().map(|t| t.w).collect::<Vec<_>>(),
                );
                let w_arg = b.arg(&format!("w{k}"), taps.len(), Access::Read);
                args.extend([hi, w]);
                Some((hi_arg, w_arg))
            }
        };
        tables.push((k, lo_arg, linear));
    }
    let y = b.typed_arg("out", out_ty.dtype, cx.len_of(out), Access::Write);
    args.push(out);
    let width = Width::scalar(out_ty.dtype);
    // the offsets the tables add reach at most the last element along the resized axes
    let bound: i64 = resized
        .iter()
        .map(|&k| (in_dims[k] as i64 - 1) * strides[k])
        .sum::<i64>()
        + 1;
    loop_nest(&mut b, &out_ty.dims.clone(), &mut |b, vars| {
        // the copied axes address the input directly
        let base = (0..rank)
            .filter(|k| !resized.contains(k))
            .fold(Affine::constant(0), |acc, k| {
                acc.add(&Affine::var(vars[k]).scale(strides[k]))
            });
        let at = (0..rank).fold(Affine::constant(0), |acc, k| {
            acc.add(&Affine::var(vars[k]).scale(out_strides[k]))
        });
        let load = |offset: Expr| Expr::LoadAt {
            buf: x,
            base: base.clone(),
            index: Box::new(offset),
            stride: 1,
            bound,
            width,
        };
        let sum = |parts: Vec<Expr>| {
            parts
                .into_iter()
                .reduce(|a, b| Expr::binary(BinOp::Add, a, b))
                .unwrap_or(Expr::int(0, Width::I64))
        };
        let value = match r.mode {
            ResizeMode::Nearest(_) => {
                let offset = sum(tables
                    .iter()
                    .map(|&(k, lo, _)| Expr::load(lo, Affine::var(vars[k]), Width::I64))
                    .collect());
                load(offset)
            }
            ResizeMode::Linear => {
                // Σ over the corners of Π weights · x[corner], axis weights (1 - w, w)
                let mut total: Option<Expr> = None;
                for corner in 0..1usize << tables.len() {
                    let mut offsets = Vec::new();
                    let mut weight: Option<Expr> = None;
                    for (j, &(k, lo, linear)) in tables.iter().enumerate() {
                        let Some((hi, w)) = linear else { continue };
                        let wk = Expr::load(w, Affine::var(vars[k]), Width::Scalar);
                        let (table, factor) = if corner & (1 << j) == 0 {
                            let one = Expr::constant(1.0, Width::Scalar);
                            (lo, Expr::binary(BinOp::Sub, one, wk))
                        } else {
                            (hi, wk)
                        };
                        offsets.push(Expr::load(table, Affine::var(vars[k]), Width::I64));
                        weight = Some(match weight {
                            None => factor,
                            Some(p) => Expr::binary(BinOp::Mul, p, factor),
                        });
                    }
                    let term = match weight {
                        Some(wt) => Expr::binary(BinOp::Mul, wt, load(sum(offsets))),
                        None => load(sum(offsets)),
                    };
                    total = Some(match total {
                        None => term,
                        Some(t) => Expr::binary(BinOp::Add, t, term),
                    });
                }
                total.unwrap_or_else(|| load(Expr::int(0, Width::I64)))
            }
        };
        b.store(y, at, value, width);
    });
    cx.step(b.finish(), args)
}
