//! Lowering of `resize`: each resized axis gets compile-time tables of the input offsets
//! (index times stride) and weights its output indices read ([`ResizeAttrs::taps`], the
//! interpreter's too), and the kernel sums table entries into a run-time offset read by
//! `LoadAt` — a data-dependent address whose bound the checker proves and the generated
//! code tests, so even a wrong table could never read outside the input. A few taps
//! (nearest, linear, cubic) are written out as one expression; the wide kernels of
//! antialiasing loop over their taps into an accumulator instead, so code size stays
//! independent of the scale.

use smelt_ir::loops::{Access, Affine, BinOp, BufId, CmpOp, Expr, KernelBuilder, LoopVar, Width};
use smelt_ir::op::{CoordinateMode, ResizeAttrs, ResizeMode};
use smelt_ir::{DType, Diagnostic, Layout, TensorData, TensorType, Value};

use super::elementwise::{dims_name, loop_nest, row_major_strides, Epilogue};
use super::{BufferId, Cx};

/// Products of taps up to this many terms are written out (cubic in two dims is 16);
/// wider ones loop.
const UNROLLED_TERMS: usize = 16;

/// The kernel arguments of one resized axis.
struct AxisTables {
    /// The axis.
    k: usize,
    /// Taps per output index.
    per_output: usize,
    /// Input offset of each tap (`i64`, output-major).
    offsets: BufId,
    /// Weight of each tap (absent for nearest without a crop: every weight is 1).
    weights: Option<BufId>,
    /// Per output index, 1 inside the crop window and 0 outside (crops only).
    inside: Option<BufId>,
}

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
    let blocked = cx.func.type_of(operands[0]).layout != Layout::RowMajor
        || out_ty.layout != Layout::RowMajor;
    if blocked {
        return match crate::blocks::resize_repeats_pixels(r, &in_dims) {
            Some(factors) if cx.func.type_of(operands[0]).layout == out_ty.layout => {
                lower_replication(cx, &factors, operands[0], out_ty, out)
            }
            _ => Err(cx.unsupported(
                "a resize on channel blocks repeats whole pixels: nearest, by whole factors \
                 along H and W, from blocks into blocks",
            )),
        };
    }
    let rank = in_dims.len();
    let strides = row_major_strides(&in_dims);
    let out_strides = row_major_strides(&out_ty.dims);
    let resized: Vec<usize> = (0..rank).filter(|&k| r.resizes(k, &in_dims)).collect();
    let crops = r.coordinate == CoordinateMode::TfCropAndResize;
    let weighted = crops || !matches!(r.mode, ResizeMode::Nearest(_));
    if !weighted {
        if let Some(factors) = replication_factors(r, &in_dims) {
            return lower_replication(cx, &factors, operands[0], out_ty, out);
        }
    }
    let mut b = KernelBuilder::new(&format!("resize_{}", dims_name(&out_ty.dims)));
    let x_buf = cx.buf(operands[0]);
    let dtype = cx.dtype_of(x_buf);
    let x = b.typed_arg("x", dtype, cx.len_of(x_buf), Access::Read);
    let mut args = vec![x_buf];
    let mut tables = Vec::new();
    for &k in &resized {
        let taps = r.taps(k, in_dims[k]);
        let offsets = TensorData::I64(taps.index.iter().map(|&i| i as i64 * strides[k]).collect());
        args.push(cx.typed_constant(&format!("resize_at{k}"), &offsets));
        let offsets = b.typed_arg(
            &format!("at{k}"),
            DType::I64,
            taps.index.len(),
            Access::Read,
        );
        let weights = weighted.then(|| {
            let w: Vec<f32> = taps.weight.iter().map(|&w| w as f32).collect();
            args.push(cx.constant(&format!("resize_w{k}"), &w));
            b.arg(&format!("w{k}"), w.len(), Access::Read)
        });
        let inside = crops.then(|| {
            let m: Vec<f32> = taps
                .inside
                .iter()
                .map(|&i| f32::from(u8::from(i)))
                .collect();
            args.push(cx.constant(&format!("resize_in{k}"), &m));
            b.arg(&format!("in{k}"), m.len(), Access::Read)
        });
        tables.push(AxisTables {
            k,
            per_output: taps.per_output,
            offsets,
            weights,
            inside,
        });
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
    let terms: usize = tables.iter().map(|t| t.per_output).product();
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
        // one term of the sum: tap `tap(j)` of every resized axis `j`
        let term = |tap: &dyn Fn(usize) -> Affine| {
            let mut offset: Option<Expr> = None;
            let mut weight: Option<Expr> = None;
            for (j, t) in tables.iter().enumerate() {
                let index = Affine::var(vars[t.k])
                    .scale(t.per_output as i64)
                    .add(&tap(j));
                let o = Expr::load(t.offsets, index.clone(), Width::I64);
                offset = Some(offset.map_or(o.clone(), |s| Expr::binary(BinOp::Add, s, o)));
                if let Some(w) = t.weights {
                    let w = Expr::load(w, index, Width::Scalar);
                    weight = Some(weight.map_or(w.clone(), |p| Expr::binary(BinOp::Mul, p, w)));
                }
            }
            let value = Expr::LoadAt {
                buf: x,
                base: base.clone(),
                index: Box::new(offset.unwrap_or(Expr::int(0, Width::I64))),
                stride: 1,
                bound,
                width,
            };
            match weight {
                Some(w) => Expr::binary(BinOp::Mul, w, value),
                None => value,
            }
        };
        let mut value = if terms <= UNROLLED_TERMS {
            // Σ over every combination of taps, the last axis's fastest
            let mut total: Option<Expr> = None;
            for combination in 0..terms {
                let tap = |j: usize| {
                    let inner: usize = tables[j + 1..].iter().map(|t| t.per_output).product();
                    Affine::constant(((combination / inner) % tables[j].per_output) as i64)
                };
                let t = term(&tap);
                total = Some(total.map_or(t.clone(), |s| Expr::binary(BinOp::Add, s, t)));
            }
            total.unwrap_or_else(|| term(&|_| Affine::constant(0)))
        } else {
            let acc = b.var(Width::Scalar);
            b.assign(acc, Expr::constant(0.0, Width::Scalar));
            let mut taps: Vec<LoopVar> = Vec::new();
            tap_loops(b, &tables, &mut taps, &mut |b, taps| {
                let t = term(&|j| Affine::var(taps[j]));
                b.assign(acc, Expr::binary(BinOp::Add, Expr::Var(acc), t));
            });
            Expr::Var(acc)
        };
        if crops {
            // outside the window on any axis the taps weigh 0; the output is the
            // extrapolation value there (selected, so a non-finite input cannot leak in)
            let inside = tables
                .iter()
                .filter_map(|t| {
                    t.inside
                        .map(|m| Expr::load(m, Affine::var(vars[t.k]), Width::Scalar))
                })
                .reduce(|a, m| Expr::binary(BinOp::Mul, a, m));
            if let Some(inside) = inside {
                value = Expr::select(
                    CmpOp::Gt,
                    inside,
                    Expr::constant(0.5, Width::Scalar),
                    value,
                    Expr::constant(r.extrapolation.0, Width::Scalar),
                );
            }
        }
        b.store(y, at, value, width);
    });
    cx.step(b.finish(), args)
}

/// Loops over every resized axis's taps (the first table's outermost), calling `body`
/// with the tap variables innermost.
fn tap_loops(
    b: &mut KernelBuilder,
    tables: &[AxisTables],
    taps: &mut Vec<LoopVar>,
    body: &mut dyn FnMut(&mut KernelBuilder, &[LoopVar]),
) {
    match tables.get(taps.len()) {
        None => body(b, taps),
        Some(t) => b.for_loop(0, t.per_output as i64, 1, |b, v| {
            taps.push(v);
            tap_loops(b, tables, taps, body);
            taps.pop();
        }),
    }
}

/// Per axis, the integer factor a nearest resize repeats each input element by, when
/// its taps are exactly that (output `o` reads input `o / factor` along every axis, as
/// the tables say: ONNX's ×2 upsampling with `floor` and `asymmetric`, for one); `None`
/// for any other sampling.
pub(crate) fn replication_factors(r: &ResizeAttrs, in_dims: &[usize]) -> Option<Vec<usize>> {
    in_dims
        .iter()
        .enumerate()
        .map(|(k, &len)| {
            let out = *r.sizes.get(k)?;
            if len == 0 || out % len != 0 {
                return None;
            }
            let factor = out / len;
            let taps = r.taps(k, len);
            let exact = taps.per_output == 1
                && taps.index.len() == out
                && taps.index.iter().enumerate().all(|(o, &i)| i == o / factor);
            exact.then_some(factor)
        })
        .collect()
}

/// The most copies of one element written out in a row (wider factors loop).
const UNROLLED_COPIES: usize = 8;

/// A nearest resize that repeats every element `factors[k]` times along axis `k`: loops
/// over the input with affine addresses, each element loaded once and stored to its
/// copies along the last axis (no tables, no run-time index). In channel blocks
/// (`[n][c/16][h][w][16]`, factors 1 along N and C) the element is a pixel's 16 channels,
/// copied as 4 vectors.
fn lower_replication(
    cx: &mut Cx,
    factors: &[usize],
    x: Value,
    out_ty: &TensorType,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let x_ty = cx.func.type_of(x).clone();
    let x_buf = cx.buf(x);
    let dtype = cx.dtype_of(x_buf);
    // the storage walked: blocked tensors as [n, c/16, h, w, 4 vectors of 4]
    let (in_dims, out_dims, factors, width, unit) = match x_ty.layout {
        Layout::Blocked { block, .. } => {
            let block = block as usize;
            let vectors = block / 4;
            let blocked = |d: &[usize]| vec![d[0], d[1].div_ceil(block), d[2], d[3], vectors];
            let mut f = factors.to_vec();
            f.push(1);
            let dims = (blocked(&x_ty.dims), blocked(&out_ty.dims));
            (dims.0, dims.1, f, Width::F32x4, 4)
        }
        Layout::RowMajor => (
            x_ty.dims.clone(),
            out_ty.dims.clone(),
            factors.to_vec(),
            Width::scalar(dtype),
            1,
        ),
    };
    let scaled =
        |d: &[usize]| -> Vec<i64> { row_major_strides(d).iter().map(|s| s * unit).collect() };
    let (strides, out_strides) = (scaled(&in_dims), scaled(&out_dims));
    let factors = &factors[..];
    let blocked_name = if unit > 1 { "c16_" } else { "" };
    let mut b = KernelBuilder::new(&format!(
        "resize_repeat_{blocked_name}{}",
        dims_name(&out_ty.dims)
    ));
    let xa = b.typed_arg("x", dtype, cx.len_of(x_buf), Access::Read);
    let ya = b.typed_arg("out", out_ty.dtype, cx.len_of(out), Access::Write);
    /// Loops over input axis `k` and its copies, then the inner axes.
    #[allow(clippy::too_many_arguments)]
    fn nest(
        b: &mut KernelBuilder,
        k: usize,
        (in_dims, factors): (&[usize], &[usize]),
        (strides, out_strides): (&[i64], &[i64]),
        (src, dst): (Affine, Affine),
        (xa, ya): (BufId, BufId),
        width: Width,
    ) {
        let factor = factors[k];
        let last = k + 1 == in_dims.len();
        b.for_loop(0, in_dims[k] as i64, 1, |b, i| {
            let src = src.add(&Affine::var(i).scale(strides[k]));
            // output index i·factor + copy along this axis
            let first = dst.add(&Affine::var(i).scale(factor as i64 * out_strides[k]));
            if last && factor <= UNROLLED_COPIES {
                let v = b.let_(Expr::load(xa, src, width), width);
                for c in 0..factor as i64 {
                    b.store(ya, first.plus(c * out_strides[k]), v.clone(), width);
                }
                return;
            }
            b.for_loop(0, factor as i64, 1, |b, c| {
                let dst = first.add(&Affine::var(c).scale(out_strides[k]));
                if last {
                    b.store(ya, dst, Expr::load(xa, src.clone(), width), width);
                } else {
                    let tables = (in_dims, factors);
                    nest(
                        b,
                        k + 1,
                        tables,
                        (strides, out_strides),
                        (src.clone(), dst),
                        (xa, ya),
                        width,
                    );
                }
            });
        });
    }
    if !in_dims.is_empty() {
        nest(
            &mut b,
            0,
            (&in_dims, factors),
            (&strides, &out_strides),
            (Affine::constant(0), Affine::constant(0)),
            (xa, ya),
            width,
        );
    }
    cx.step(b.finish(), vec![x_buf, out])
}
