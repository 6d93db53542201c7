//! Lowering of `grid_sample`: per result point (batch and grid position) the kernel
//! reads the grid's coordinates and computes, in registers, what the interpreter's
//! [`GridSampleAttrs::taps`] computes — denormalization, rounding for nearest, the
//! padding's clamp or reflection (NaN and far coordinates included), each tap's index
//! clamped into its axis and its weight (0 for a tap zeros padding reads as 0) — then the
//! offset and weight of every combination of one tap per axis; a loop over channels sums
//! the weighted elements read through `LoadAt`. Every index is clamped before the load,
//! so no grid value, however wrong, reads outside the input (and the generated code's
//! bound test never fails).

use smelt_ir::loops::{Access, Affine, BinOp, CmpOp, Expr, KernelBuilder, UnOp, Width};
use smelt_ir::op::{
    GridAxis, GridPadding, GridSampleAttrs, SampleMode, GRID_CUBIC_A, GRID_REFLECT_LIMIT,
    GRID_ZEROS_REACH,
};
use smelt_ir::{Diagnostic, TensorType, Value};

use super::elementwise::{dims_name, loop_nest, row_major_strides, Epilogue};
use super::{BufferId, Cx};

/// Tap combinations the kernel writes out (cubic over three axes is 64).
const MAX_COMBINATIONS: usize = 64;

fn c(v: f64) -> Expr {
    Expr::constant(v as f32, Width::Scalar)
}

fn add(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Add, a, b)
}

fn sub(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Sub, a, b)
}

fn mul(a: Expr, b: Expr) -> Expr {
    Expr::binary(BinOp::Mul, a, b)
}

/// `x` limited to `[lo, hi]` (a NaN becomes `lo`: both comparisons fail on it).
fn clamp(x: Expr, lo: f64, hi: f64) -> Expr {
    let low = Expr::select(CmpOp::Ge, x.clone(), c(lo), x, c(lo));
    Expr::select(CmpOp::Le, low.clone(), c(hi), low, c(hi))
}

/// `x` (a variable's value) reflected into the axis's borders, as [`smelt_ir::op::reflect`].
fn reflect(b: &mut KernelBuilder, x: Expr, axis: &GridAxis) -> Expr {
    let range = axis.high - axis.low;
    if range <= 0.0 {
        return c(axis.low);
    }
    // one side: the distance past `from` folded into the range, the fold's parity
    // choosing the border it is measured from
    let side = |b: &mut KernelBuilder, distance: Expr, from: f64, to: f64| {
        let distance = b.let_(distance, Width::Scalar);
        let n = b.let_(
            Expr::unary(
                UnOp::Floor,
                Expr::binary(BinOp::Div, distance.clone(), c(range)),
            ),
            Width::Scalar,
        );
        let rest = b.let_(sub(distance, mul(n.clone(), c(range))), Width::Scalar);
        let odd = sub(
            n.clone(),
            mul(c(2.0), Expr::unary(UnOp::Floor, mul(n, c(0.5)))),
        );
        let toward = if from < to { 1.0 } else { -1.0 };
        Expr::select(
            CmpOp::Lt,
            odd,
            c(0.5),
            add(c(from), mul(c(toward), rest.clone())),
            sub(c(to), mul(c(toward), rest)),
        )
    };
    let below = side(b, sub(c(axis.low), x.clone()), axis.low, axis.high);
    let above = side(b, sub(x.clone(), c(axis.high)), axis.high, axis.low);
    Expr::select(
        CmpOp::Lt,
        x.clone(),
        c(axis.low),
        below,
        Expr::select(CmpOp::Gt, x.clone(), c(axis.high), above, x),
    )
}

/// The sampled coordinate of grid value `g` along `axis` ([`GridSampleAttrs::coordinate`]).
fn coordinate(b: &mut KernelBuilder, g: &GridSampleAttrs, axis: &GridAxis, value: Expr) -> Expr {
    let last = axis.len.saturating_sub(1) as f64;
    let mut x = add(mul(value, c(axis.scale)), c(axis.shift));
    if g.mode == SampleMode::Nearest {
        x = Expr::unary(UnOp::Nearest, x);
    }
    let x = b.let_(x, Width::Scalar);
    let x = match g.padding {
        GridPadding::Zeros => clamp(x, -GRID_ZEROS_REACH, last + GRID_ZEROS_REACH),
        // cubic clamps each tap, not the coordinate
        GridPadding::Border if g.mode == SampleMode::Cubic => {
            clamp(x, -GRID_ZEROS_REACH, last + GRID_ZEROS_REACH)
        }
        GridPadding::Border => {
            let low = Expr::select(CmpOp::Ge, x.clone(), c(axis.low), x, c(0.0));
            let low = b.let_(low, Width::Scalar);
            Expr::select(CmpOp::Le, low.clone(), c(axis.high), low, c(last))
        }
        GridPadding::Reflection => {
            let finite = Expr::select(CmpOp::Eq, x.clone(), x.clone(), x, c(axis.low));
            let finite = b.let_(
                clamp(finite, -GRID_REFLECT_LIMIT, GRID_REFLECT_LIMIT),
                Width::Scalar,
            );
            reflect(b, finite, axis)
        }
    };
    b.let_(x, Width::Scalar)
}

/// The cubic weights at fraction `t` (a variable's value), as [`smelt_ir::op::cubic_weights`].
fn cubic(t: &Expr) -> [Expr; 4] {
    let a = GRID_CUBIC_A;
    let near = |x: Expr| {
        // ((a + 2) x - (a + 3)) x x + 1
        add(
            mul(
                mul(sub(mul(c(a + 2.0), x.clone()), c(a + 3.0)), x.clone()),
                x,
            ),
            c(1.0),
        )
    };
    let far = |x: Expr| {
        // ((a x - 5 a) x + 8 a) x - 4 a
        sub(
            mul(
                add(
                    mul(sub(mul(c(a), x.clone()), c(5.0 * a)), x.clone()),
                    c(8.0 * a),
                ),
                x,
            ),
            c(4.0 * a),
        )
    };
    [
        far(add(t.clone(), c(1.0))),
        near(t.clone()),
        near(sub(c(1.0), t.clone())),
        far(sub(c(2.0), t.clone())),
    ]
}

/// `g` of operands 0 (`x`) and 1 (`grid`) into `out`.
pub(crate) fn lower_grid_sample(
    cx: &mut Cx,
    g: &GridSampleAttrs,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if !epi.is_empty() {
        return Err(cx.unsupported("post-ops on a grid_sample"));
    }
    let in_dims = cx.func.type_of(operands[0]).dims.clone();
    let spatial = in_dims[2..].to_vec();
    let r = spatial.len();
    let combinations = g.mode.taps().saturating_pow(r as u32);
    if combinations > MAX_COMBINATIONS {
        return Err(cx.unsupported(format!(
            "{} sampling over {r} spatial axes ({combinations} taps per point; at most \
             {MAX_COMBINATIONS})",
            g.mode.name()
        )));
    }
    let (n, channels) = (out_ty.dims[0], out_ty.dims[1]);
    let points: usize = out_ty.dims[2..].iter().product();
    let plane: usize = spatial.iter().product();
    let strides = row_major_strides(&spatial);
    let point_strides = row_major_strides(&out_ty.dims[2..]);
    let axes: Vec<GridAxis> = spatial.iter().map(|&d| g.axis(d)).collect();

    let mut b = KernelBuilder::new(&format!("grid_sample_{}", dims_name(&out_ty.dims)));
    let x_buf = cx.buf(operands[0]);
    let grid_buf = cx.buf(operands[1]);
    let x = b.arg("x", cx.len_of(x_buf), Access::Read);
    let grid = b.arg("grid", cx.len_of(grid_buf), Access::Read);
    let y = b.arg("out", cx.len_of(out), Access::Write);
    let args = vec![x_buf, grid_buf, out];

    let mut nest = vec![n];
    nest.extend_from_slice(&out_ty.dims[2..]);
    loop_nest(&mut b, &nest, &mut |b, vars| {
        let batch = vars[0];
        // the point's index within its batch's grid positions
        let point = vars[1..]
            .iter()
            .zip(&point_strides)
            .fold(Affine::constant(0), |acc, (&v, &s)| {
                acc.add(&Affine::var(v).scale(s))
            });
        let grid_at = Affine::var(batch)
            .scale((points * r) as i64)
            .add(&point.scale(r as i64));
        // per axis: each tap's element offset (i64) and weight
        let mut taps: Vec<Vec<(Expr, Expr)>> = Vec::with_capacity(r);
        for (k, axis) in axes.iter().enumerate() {
            let last = axis.len.saturating_sub(1) as f64;
            // the grid's last axis holds the last spatial axis's coordinate first
            let value = Expr::load(
                grid,
                grid_at.add(&Affine::constant((r - 1 - k) as i64)),
                Width::Scalar,
            );
            let xk = coordinate(b, g, axis, value);
            let (first, weights) = match g.mode {
                SampleMode::Nearest => (xk, vec![c(1.0)]),
                SampleMode::Linear | SampleMode::Cubic => {
                    let floor = b.let_(Expr::unary(UnOp::Floor, xk.clone()), Width::Scalar);
                    let t = b.let_(sub(xk, floor.clone()), Width::Scalar);
                    let weights = match g.mode {
                        SampleMode::Cubic => cubic(&t).to_vec(),
                        _ => vec![sub(c(1.0), t.clone()), t],
                    };
                    (add(floor, c(g.mode.first_tap() as f64)), weights)
                }
            };
            let first = b.let_(first, Width::Scalar);
            let mut axis_taps = Vec::with_capacity(weights.len());
            for (i, w) in weights.into_iter().enumerate() {
                let at = b.let_(add(first.clone(), c(i as f64)), Width::Scalar);
                let (at, w) = match g.padding {
                    GridPadding::Zeros => {
                        // outside the axis the tap reads 0: its weight is 0
                        let inside = Expr::select(CmpOp::Le, at.clone(), c(last), w, c(0.0));
                        (
                            at.clone(),
                            Expr::select(CmpOp::Ge, at, c(0.0), inside, c(0.0)),
                        )
                    }
                    GridPadding::Border => (at, w),
                    GridPadding::Reflection => (reflect(b, at, axis), w),
                };
                // truncated like the reference's int(), clamped into the axis
                let index = Expr::cast(Width::I64, clamp(at, 0.0, last));
                let offset = Expr::binary(BinOp::Mul, index, Expr::int(strides[k], Width::I64));
                axis_taps.push((b.let_(offset, Width::I64), b.let_(w, Width::Scalar)));
            }
            taps.push(axis_taps);
        }
        // every combination of one tap per axis, the last axis's fastest
        let mut terms: Vec<(Expr, Expr)> = Vec::with_capacity(combinations);
        for combination in 0..combinations {
            let mut offset: Option<Expr> = None;
            let mut weight: Option<Expr> = None;
            let mut rest = combination;
            for axis_taps in taps.iter().rev() {
                let (o, w) = &axis_taps[rest % axis_taps.len()];
                rest /= axis_taps.len();
                offset = Some(offset.map_or(o.clone(), |s| Expr::binary(BinOp::Add, o.clone(), s)));
                weight = Some(weight.map_or(w.clone(), |p| mul(w.clone(), p)));
            }
            let offset = offset.unwrap_or(Expr::int(0, Width::I64));
            let weight = weight.unwrap_or(c(1.0));
            terms.push((b.let_(offset, Width::I64), b.let_(weight, Width::Scalar)));
        }
        let y_at = Affine::var(batch)
            .scale((channels * points) as i64)
            .add(&point);
        b.for_loop(0, channels as i64, 1, |b, ch| {
            let base = Affine::var(batch)
                .scale((channels * plane) as i64)
                .add(&Affine::var(ch).scale(plane as i64));
            let mut sum: Option<Expr> = None;
            for (offset, weight) in &terms {
                let value = Expr::LoadAt {
                    buf: x,
                    base: base.clone(),
                    index: Box::new(offset.clone()),
                    stride: 1,
                    bound: plane as i64,
                    width: Width::Scalar,
                };
                // a weight of 0 contributes nothing, even next to an infinity
                let term = Expr::select(
                    CmpOp::Ne,
                    weight.clone(),
                    c(0.0),
                    mul(weight.clone(), value),
                    c(0.0),
                );
                sum = Some(sum.map_or(term.clone(), |s| add(s, term)));
            }
            let value = sum.unwrap_or(c(0.0));
            b.store(
                y,
                y_at.add(&Affine::var(ch).scale(points as i64)),
                value,
                Width::Scalar,
            );
        });
    });
    cx.step(b.finish(), args)
}
