//! Lowerings of pools, gemm/matmul, normalizations and data movement ops.

use smelt_ir::loops::{
    Access, Affine, BinOp, BufId, CmpOp, Expr, KernelBuilder, ReduceOp, UnOp, VarId, Width,
};
use smelt_ir::op::{GemmAttrs, Pool2dAttrs};
use smelt_ir::{Diagnostic, Layout, Op, TensorType, Value};

use super::conv::{pad_kernel, CHANNEL_BLOCK, CHANNEL_BLOCKS};
use super::elementwise::{
    broadcast_strides, collapse, dims_name, emit_nest, index_of, load_lanes, row_major_strides,
    Epilogue,
};
use super::{BufferId, Cx};

// ---------------------------------------------------------------------------------------
// Pools

/// max_pool2d, avg_pool2d and global_avg_pool over NCHW (and the halving 3×3 max pool
/// and global_avg_pool over channel blocks), with post-ops in registers.
pub(crate) fn lower_pool(
    cx: &mut Cx,
    op: &Op,
    operands: &[Value],
    out_ty: &TensorType,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let xt = cx.func.type_of(operands[0]).clone();
    let x = cx.buf(operands[0]);
    let (p, is_max, include_pad) = match op {
        Op::MaxPool2d(p) => (p.clone(), true, false),
        Op::AvgPool2d {
            pool,
            count_include_pad,
        } => (pool.clone(), false, *count_include_pad),
        Op::GlobalAvgPool => return global_avg_pool(cx, &xt, x, out_ty, epi, out),
        _ => return Err(cx.unsupported("not a pool")),
    };
    if xt.rank() != 4 {
        return Err(cx.unsupported("pools take rank-4 NCHW input"));
    }
    let [n, c, h, w] = [xt.dims[0], xt.dims[1], xt.dims[2], xt.dims[3]];
    let [oh, ow] = [out_ty.dims[2], out_ty.dims[3]];
    if xt.layout != Layout::RowMajor || out_ty.layout != Layout::RowMajor {
        if !max_pool_on_blocks(op, &xt, out_ty) || !epi.runs_along_channels() {
            return Err(cx.unsupported(
                "pools on channel blocks (nchw16c) are 3×3 stride-2 max pools with one pixel \
                 of top and left padding that halve an even plane, from blocks into blocks, \
                 with per-channel or full-size post-op operands",
            ));
        }
        return max_pool_3x3_s2(cx, x, [n, c, h, w], true, epi, out);
    }
    if is_max && halves_with_3x3_windows(&p, [h, w], [oh, ow]) {
        return max_pool_3x3_s2(cx, x, [n, c, h, w], false, epi, out);
    }
    let [sh, sw] = p.strides;
    let [dh, dw] = p.dilations;
    let [kh, kw] = p.kernel;
    // room for every tap, including windows hanging past the end padding (ceil mode)
    let hp = (h + p.pads[0] + p.pads[2]).max((oh - 1) * sh + (kh - 1) * dh + 1);
    let wp = (w + p.pads[1] + p.pads[3]).max((ow - 1) * sw + (kw - 1) * dw + 1);
    let wq = wp.div_ceil(sw);
    let fill = if is_max { f32::NEG_INFINITY } else { 0.0 };
    let len = n * c * hp * sw * wq;
    let xp = cx.temp("padded", len);
    let k = pad_kernel(
        n * c,
        [h, w],
        [p.pads[0], p.pads[1]],
        sw,
        [hp, wq],
        fill,
        cx.len_of(x),
        len,
    );
    cx.step(k, vec![x, xp])?;

    // Per output position: avg pools multiply by 1/count; max pools add 0, or NaN for a
    // window that holds no input element (as the interpreter defines).
    let (table, needed) = pool_table(&p, is_max, include_pad, [h, w], [oh, ow]);
    let mut b = KernelBuilder::new(&format!(
        "{}_{}_k{kh}x{kw}_s{sh}x{sw}_d{dh}x{dw}",
        op.name(),
        dims_name(&[n, c, hp, sw * wq]),
    ));
    let xa = b.arg("x", len, Access::Read);
    let mut args = vec![xp];
    let ta = if needed {
        let tb = cx.constant("pool_table", &table);
        args.push(tb);
        Some(b.arg("table", table.len(), Access::Read))
    } else {
        None
    };
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let window = |b: &mut KernelBuilder, np: &Affine, r: &Affine, q: &Affine, wd: Width| {
        let acc = b.var(wd);
        b.assign(acc, Expr::constant(fill, wd));
        for ky in 0..kh {
            for kx in 0..kw {
                let col = kx * dw;
                let (phase, shift) = (col % sw, col / sw);
                let row = r.scale(sh as i64).plus((ky * dh) as i64);
                let idx = np
                    .scale((hp * sw * wq) as i64)
                    .add(&row.scale((sw * wq) as i64))
                    .add(&q.plus((phase * wq + shift) as i64));
                let v = Expr::load(xa, idx, wd);
                if is_max {
                    // NaN propagates (as the interpreter defines): `max(v, acc)` keeps a
                    // NaN accumulator, and the select lets a NaN input (v >= v fails) win.
                    let v = b.let_(v, wd);
                    let m = Expr::binary(BinOp::Max, v.clone(), Expr::Var(acc));
                    let keep = Expr::select(CmpOp::Ge, v.clone(), v.clone(), m, v);
                    b.assign(acc, keep);
                } else {
                    b.assign(acc, Expr::binary(BinOp::Add, Expr::Var(acc), v));
                }
            }
        }
        acc
    };
    // channels outermost: split across threads
    b.set_parallel();
    b.for_loop(0, c as i64, 1, |b, ci| {
        b.for_loop(0, n as i64, 1, |b, ni| {
            let np = Affine::var(ni).scale(c as i64).add(&Affine::var(ci));
            b.for_loop(0, oh as i64, 1, |b, r| {
                let r = Affine::var(r);
                let emit = |b: &mut KernelBuilder, q: Affine, wd: Width| {
                    let acc = window(b, &np, &r, &q, wd);
                    let pos = r.scale(ow as i64).add(&q);
                    let mut v = Expr::Var(acc);
                    if let Some(t) = ta {
                        let tv = Expr::load(t, pos.clone(), wd);
                        let op = if is_max { BinOp::Add } else { BinOp::Mul };
                        v = Expr::binary(op, v, tv);
                    }
                    let idx = [Affine::var(ni), Affine::var(ci), r.clone(), q.clone()];
                    let v = epi.apply(b, v, &idx, wd);
                    let dst = np.scale((oh * ow) as i64).add(&pos);
                    b.store(ya, dst, v, wd);
                };
                let vec_end = (ow / 4 * 4) as i64;
                b.for_loop(0, vec_end, 4, |b, q| emit(b, Affine::var(q), Width::F32x4));
                b.for_loop(vec_end, ow as i64, 1, |b, q| {
                    emit(b, Affine::var(q), Width::Scalar)
                });
            });
        });
    });
    cx.step(b.finish(), args)
}

/// Whether a pool is the 3×3, stride-2, pad-1 window that halves an even H and a W that
/// is a multiple of 8 (ResNet's stem pool): every window holds input elements, no
/// window reaches the bottom or right padding, and output rows come in whole vectors.
fn halves_with_3x3_windows(p: &Pool2dAttrs, [h, w]: [usize; 2], [oh, ow]: [usize; 2]) -> bool {
    p.kernel == [3, 3]
        && p.strides == [2, 2]
        && p.dilations == [1, 1]
        && p.pads[0] == 1
        && p.pads[1] == 1
        && h >= 2
        && h.is_multiple_of(2)
        && w.is_multiple_of(8)
        && (oh, ow) == (h / 2, w / 2)
}

/// The halving 3×3 stride-2 max pool ([`halves_with_3x3_windows`]) straight from its
/// input, without a padded copy, NCHW or in channel blocks (`[n][c/16][h][w][16]` →
/// `[n][c/16][h/2][w/2][16]`, `blocked`). Each output row takes the vertical max of its
/// 2–3 input rows ([`halving_rows`]); output column `q` is the max of input columns
/// `2q − 1` (carried over from the column before, −∞ left of the row), `2q` and `2q + 1`:
/// NCHW on 8 columns at a time, split into even and odd columns by two shuffles; in blocks
/// on vectors of 4 channels of one pixel, so every input vector is loaded once per output
/// row. Parallel over channel planes (blocks).
fn max_pool_3x3_s2(
    cx: &mut Cx,
    x: BufferId,
    [n, c, h, w]: [usize; 4],
    blocked: bool,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let (oh, ow) = (h / 2, w / 2);
    let mut b = KernelBuilder::new(&format!(
        "max_pool2d_3x3_s2_{}{}",
        dims_name(&[n, c, h, w]),
        if blocked { "c16" } else { "" }
    ));
    let xa = b.arg("x", cx.len_of(x), Access::Read);
    let mut args = vec![x];
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let w4 = Width::F32x4;
    let max = |a: Expr, b: Expr| Expr::binary(BinOp::Max, a, b);
    // floats per pixel of a plane; planes per image
    let unit = if blocked { CHANNEL_BLOCK } else { 1 };
    let planes = c / unit;
    // the column carried from one step to the next: one vector NCHW, one per quad of
    // channels in blocks
    let carried: Vec<VarId> = (0..unit.div_ceil(4)).map(|_| b.var(w4)).collect();
    b.set_parallel();
    b.for_loop(0, planes as i64, 1, |b, cp| {
        b.for_loop(0, n as i64, 1, |b, ni| {
            let (cp, ni) = (Affine::var(cp), Affine::var(ni));
            let plane = ni.scale(planes as i64).add(&cp);
            // pixel (row, col) of the plane in an image of `[rows, cols]`, times `unit`
            let pixel = |[rows, cols]: [usize; 2], row: &Affine, col: &Affine| {
                plane
                    .scale((rows * cols) as i64)
                    .add(&row.scale(cols as i64))
                    .add(col)
                    .scale(unit as i64)
            };
            let x_at = |y: &Affine, col: &Affine| pixel([h, w], y, col);
            let y_at = |r: &Affine, q: &Affine| pixel([oh, ow], r, q);
            halving_rows(b, oh, |b, r, window| {
                for &v in &carried {
                    b.assign(v, Expr::constant(f32::NEG_INFINITY, w4));
                }
                // the vertical max of input column `col`, lanes from `lane` on
                let column = |b: &mut KernelBuilder, col: &Affine, lane: i64| {
                    window_max(b, window, |dy| {
                        let y = r.scale(2).plus(dy);
                        Expr::load(xa, x_at(&y, col).plus(lane), w4)
                    })
                };
                if !blocked {
                    let left = carried[0];
                    return b.for_loop(0, ow as i64, 4, |b, q| {
                        let q = Affine::var(q);
                        let lo = column(b, &q.scale(2), 0);
                        let hi = column(b, &q.scale(2).plus(4), 0);
                        let even = b.let_(Expr::shuffle(lo.clone(), hi.clone(), [0, 2, 4, 6]), w4);
                        let odd = b.let_(Expr::shuffle(lo, hi, [1, 3, 5, 7]), w4);
                        let before = Expr::shuffle(Expr::Var(left), odd.clone(), [3, 4, 5, 6]);
                        let m = b.let_(max(max(before, even), odd.clone()), w4);
                        b.assign(left, odd);
                        let idx = [ni.clone(), cp.clone(), r.clone(), q.clone()];
                        let v = epi.apply(b, m, &idx, w4);
                        b.store(ya, y_at(&r, &q), v, w4);
                    });
                }
                b.for_loop(0, ow as i64, 1, |b, q| {
                    let q = Affine::var(q);
                    for (k, &left) in carried.iter().enumerate() {
                        let lane = 4 * k as i64;
                        let even = column(b, &q.scale(2), lane);
                        let odd = column(b, &q.scale(2).plus(1), lane);
                        let m = b.let_(max(max(Expr::Var(left), even), odd.clone()), w4);
                        b.assign(left, odd);
                        let o = cp.scale(unit as i64).plus(lane);
                        let idx = [ni.clone(), o, r.clone(), q.clone()];
                        let stored = y_at(&r, &q).plus(lane);
                        let v = epi.apply_along_channels(b, m, &idx, &stored, w4);
                        b.store(ya, stored, v, w4);
                    }
                });
            });
        });
    });
    cx.step(b.finish(), args)
}

/// The output rows of a halving 3×3 stride-2 max pool: `row(b, r, window)` for output row
/// `r`, whose window covers input rows `2r + dy` for `dy` in `window` (the first row's
/// has no row above: that is padding).
fn halving_rows(
    b: &mut KernelBuilder,
    oh: usize,
    row: impl Fn(&mut KernelBuilder, Affine, &[i64]),
) {
    row(b, Affine::constant(0), &[0, 1]);
    b.for_loop(1, oh as i64, 1, |b, r| row(b, Affine::var(r), &[-1, 0, 1]));
}

/// The max of `at(dy)` over the window rows `dy`, bound to a variable.
fn window_max(b: &mut KernelBuilder, window: &[i64], at: impl Fn(i64) -> Expr) -> Expr {
    let max = |a: Expr, b: Expr| Expr::binary(BinOp::Max, a, b);
    let v = window[1..]
        .iter()
        .fold(at(window[0]), |m, &dy| max(m, at(dy)));
    b.let_(v, Width::F32x4)
}

/// Whether `op` is a max pool that the channel-block kernel computes for input `x` and
/// result `out` ([`max_pool_3x3_s2`] on blocks): [`max_pool_fits_blocks`], with input and
/// result both in blocks.
pub(crate) fn max_pool_on_blocks(op: &Op, x: &TensorType, out: &TensorType) -> bool {
    x.layout == CHANNEL_BLOCKS
        && out.layout == CHANNEL_BLOCKS
        && max_pool_fits_blocks(op, &x.dims, &out.dims)
}

/// Whether `op` is a max pool the channel-block kernel can compute from input dims `x`
/// to result dims `out`, whatever their layouts: a halving 3×3 stride-2 window on whole
/// blocks of channels. The layout pass and lowering share this test.
pub(crate) fn max_pool_fits_blocks(op: &Op, x: &[usize], out: &[usize]) -> bool {
    let Op::MaxPool2d(p) = op else {
        return false;
    };
    x.len() == 4
        && out.len() == 4
        && x[1].is_multiple_of(CHANNEL_BLOCK)
        && halves_with_3x3_windows(p, [x[2], x[3]], [out[2], out[3]])
}

/// The per-output-position table and whether it is needed (not all zeros for max pools).
fn pool_table(
    p: &Pool2dAttrs,
    is_max: bool,
    include_pad: bool,
    input: [usize; 2],
    out: [usize; 2],
) -> (Vec<f32>, bool) {
    let taps = |axis: usize, o: usize, lo: isize, hi: isize| -> usize {
        let start = (o * p.strides[axis]) as isize - p.pads[axis] as isize;
        (0..p.kernel[axis] as isize)
            .map(|k| start + k * p.dilations[axis] as isize)
            .filter(|t| (lo..hi).contains(t))
            .count()
    };
    let mut table = Vec::with_capacity(out[0] * out[1]);
    let mut any_empty = false;
    for oy in 0..out[0] {
        for ox in 0..out[1] {
            let real = taps(0, oy, 0, input[0] as isize) * taps(1, ox, 0, input[1] as isize);
            any_empty |= real == 0;
            let v = if is_max {
                if real == 0 {
                    f32::NAN
                } else {
                    0.0
                }
            } else {
                let count = if include_pad {
                    let ys = taps(
                        0,
                        oy,
                        -(p.pads[0] as isize),
                        (input[0] + p.pads[2]) as isize,
                    );
                    let xs = taps(
                        1,
                        ox,
                        -(p.pads[1] as isize),
                        (input[1] + p.pads[3]) as isize,
                    );
                    ys * xs
                } else {
                    real
                };
                (1.0f64 / count as f64) as f32
            };
            table.push(v);
        }
    }
    (table, !is_max || any_empty)
}

fn global_avg_pool(
    cx: &mut Cx,
    xt: &TensorType,
    x: BufferId,
    out_ty: &TensorType,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let (n, c) = (xt.dims[0], xt.dims[1]);
    let inner: usize = xt.dims[2..].iter().product();
    let blocked = xt.layout == CHANNEL_BLOCKS;
    if xt.layout != Layout::RowMajor && !(blocked && epi.runs_along_channels()) {
        return Err(cx.unsupported(
            "global_avg_pool reads row-major or nchw16c input (with per-channel or full-size post-op operands)",
        ));
    }
    let mut b = KernelBuilder::new(&format!(
        "global_avg_pool_{}{}",
        dims_name(&xt.dims),
        if blocked { "c16" } else { "" }
    ));
    let xa = b.arg("x", cx.len_of(x), Access::Read);
    let mut args = vec![x];
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let rank = out_ty.rank();
    let scale = (1.0f64 / inner as f64) as f32;
    if blocked {
        // [n][c/16][pixel][16]: a vector of 4 channels summed down the pixels, the
        // result's 4 consecutive channels
        let unit = CHANNEL_BLOCK as i64;
        let w4 = Width::F32x4;
        let blocks = (c / CHANNEL_BLOCK) as i64;
        b.for_loop(0, n as i64, 1, |b, ni| {
            b.for_loop(0, blocks, 1, |b, cb| {
                let block = Affine::var(ni).scale(blocks).add(&Affine::var(cb));
                for quad in (0..unit).step_by(4) {
                    let acc = b.var(w4);
                    b.assign(acc, Expr::constant(0.0, w4));
                    let base = block.scale(unit * inner as i64).plus(quad);
                    b.for_loop(0, inner as i64, 1, |b, p| {
                        let at = base.add(&Affine::var(p).scale(unit));
                        let v = Expr::binary(BinOp::Add, Expr::Var(acc), Expr::load(xa, at, w4));
                        b.assign(acc, v);
                    });
                    let mean = Expr::binary(BinOp::Mul, Expr::Var(acc), Expr::constant(scale, w4));
                    let channel = Affine::var(cb).scale(unit).plus(quad);
                    let mut idx = vec![Affine::var(ni), channel];
                    idx.resize(rank, Affine::constant(0));
                    // the result is [n][c] (1×1 planes): element n·c + channel
                    let stored = block.scale(unit).plus(quad);
                    let v = epi.apply_along_channels(b, mean, &idx, &stored, w4);
                    b.store(ya, stored, v, w4);
                }
            });
        });
        return cx.step(b.finish(), args);
    }
    b.for_loop(0, n as i64, 1, |b, ni| {
        b.for_loop(0, c as i64, 1, |b, ci| {
            let plane = Affine::var(ni).scale(c as i64).add(&Affine::var(ci));
            let base = plane.scale(inner as i64);
            let sum = sum_row(b, xa, &base, inner, 1, |e| e);
            let mean = Expr::binary(BinOp::Mul, sum, Expr::constant(scale, Width::Scalar));
            let mut idx = vec![Affine::var(ni), Affine::var(ci)];
            idx.resize(rank, Affine::constant(0));
            let v = epi.apply(b, mean, &idx, Width::Scalar);
            b.store(ya, plane, v, Width::Scalar);
        });
    });
    cx.step(b.finish(), args)
}

/// Σ f(x[base + i·stride]) for i in 0..len, vectorized when `stride == 1`; returns a
/// scalar expression (a variable).
fn sum_row(
    b: &mut KernelBuilder,
    buf: BufId,
    base: &Affine,
    len: usize,
    stride: i64,
    f: impl Fn(Expr) -> Expr,
) -> Expr {
    let vec_end = if stride == 1 { len / 4 * 4 } else { 0 } as i64;
    let total = b.var(Width::Scalar);
    if vec_end > 0 {
        let acc = b.var(Width::F32x4);
        b.assign(acc, Expr::constant(0.0, Width::F32x4));
        b.for_loop(0, vec_end, 4, |b, i| {
            let v = f(Expr::load(buf, base.add(&Affine::var(i)), Width::F32x4));
            b.assign(acc, Expr::binary(BinOp::Add, Expr::Var(acc), v));
        });
        b.assign(total, Expr::Reduce(ReduceOp::Add, Box::new(Expr::Var(acc))));
    } else {
        b.assign(total, Expr::constant(0.0, Width::Scalar));
    }
    b.for_loop(vec_end, len as i64, 1, |b, i| {
        let v = f(Expr::load(
            buf,
            base.add(&Affine::var(i).scale(stride)),
            Width::Scalar,
        ));
        b.assign(total, Expr::binary(BinOp::Add, Expr::Var(total), v));
    });
    Expr::Var(total)
}

// ---------------------------------------------------------------------------------------
// Gemm and matmul

/// Rows per register tile of a matrix product.
const GEMM_ROWS: usize = 3;
/// Vectors of 4 columns per register tile (GEMM_ROWS × GEMM_VECTORS ≤ 12).
const GEMM_VECTORS: usize = 3;

/// Geometry of a (batched) matrix product `out[b, m, n] = Σ_k A[b, m, k] · B[b, k, n]`.
struct GemmGeo {
    batch: Vec<usize>,
    a_batch: Vec<i64>,
    b_batch: Vec<i64>,
    m: usize,
    n: usize,
    k: usize,
    a_m: i64,
    a_k: i64,
    b_k: i64,
    b_n: i64,
    /// Result dims and which of them are m and n (matmul with vectors drops one).
    out_dims: Vec<usize>,
    has_m: bool,
    has_n: bool,
    alpha: f32,
    beta: f32,
}

pub(crate) fn lower_gemm(
    cx: &mut Cx,
    op: &Op,
    operands: &[Value],
    out_ty: &TensorType,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let at = cx.func.type_of(operands[0]).clone();
    let bt = cx.func.type_of(operands[1]).clone();
    let mut b_buf = cx.buf(operands[1]);
    let (mut geo, c_val) = match op {
        Op::Gemm(g) => (gemm_geo(g, &at, out_ty), operands.get(2).copied()),
        Op::MatMul => (matmul_geo(&at, &bt, out_ty), None),
        _ => return Err(cx.unsupported("not a matrix product")),
    };
    // One row of A against a B whose k runs contiguously (a classifier's `transB`
    // weights): dot products, reading B once in order, split over output columns.
    let gemv = geo.batch.is_empty() && geo.m == 1 && geo.b_k == 1 && geo.k >= 16;
    // A constant B read across its rows (gemm transB): transpose it once, here.
    if geo.b_n != 1 && geo.batch.is_empty() && !gemv {
        if let Some(data) = cx.const_data(operands[1]) {
            let (k, n) = (geo.k, geo.n);
            let (bk, bn) = (geo.b_k as usize, geo.b_n as usize);
            // deferred with the weight packing, and in 64×64 blocks: ResNet-50's FC
            // weight read down its columns took 13 ms (rows 8 KB apart share cache sets)
            let transpose = move || {
                smelt_ir::AlignedBuf::from_f32_with(k * n, |t| {
                    for k0 in (0..k).step_by(64) {
                        for n0 in (0..n).step_by(64) {
                            for kk in k0..(k0 + 64).min(k) {
                                for nn in n0..(n0 + 64).min(n) {
                                    t[kk * n + nn] = data[kk * bk + nn * bn];
                                }
                            }
                        }
                    }
                })
            };
            b_buf = cx.constant_later("b_transposed", k * n, Box::new(transpose));
            geo.b_k = n as i64;
            geo.b_n = 1;
        }
    }
    let a_buf = cx.buf(operands[0]);
    let mut kb = KernelBuilder::new(&format!(
        "{}_{}x{}x{}_b{}",
        op.name(),
        geo.m,
        geo.n,
        geo.k,
        dims_name(&geo.batch)
    ));
    let aa = kb.arg("a", cx.len_of(a_buf), Access::Read);
    let ba = kb.arg("b", cx.len_of(b_buf), Access::Read);
    let mut args = vec![a_buf, b_buf];
    let c_arg = match c_val {
        Some(v) => {
            let cb = cx.buf(v);
            args.push(cb);
            let strides = broadcast_strides(&cx.func.type_of(v).dims, &[geo.m, geo.n]);
            Some((kb.arg("c", cx.len_of(cb), Access::Read), strides))
        }
        None => None,
    };
    args.extend(epi.declare(&mut kb));
    let ya = kb.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let bufs = GemmBufs {
        a: aa,
        b: ba,
        c: c_arg,
        out: ya,
    };
    let out_strides = row_major_strides(&geo.out_dims);
    if gemv {
        gemv_kernel(&mut kb, &geo, &bufs, &epi, &out_strides);
        return cx.step(kb.finish(), args);
    }
    // batch loops
    fn batches(
        kb: &mut KernelBuilder,
        geo: &GemmGeo,
        d: usize,
        idx: &mut Vec<Affine>,
        body: &mut dyn FnMut(&mut KernelBuilder, &[Affine]),
    ) {
        if d == geo.batch.len() {
            body(kb, idx);
            return;
        }
        kb.for_loop(0, geo.batch[d] as i64, 1, |kb, i| {
            idx.push(Affine::var(i));
            batches(kb, geo, d + 1, idx, body);
            idx.pop();
        });
    }
    let vectorize = geo.b_n == 1;
    batches(&mut kb, &geo, 0, &mut Vec::new(), &mut |kb, bidx| {
        let a0 = index_of(&geo.a_batch, bidx);
        let b0 = index_of(&geo.b_batch, bidx);
        let rows_main = geo.m / GEMM_ROWS * GEMM_ROWS;
        let row_block = |kb: &mut KernelBuilder, m0: Affine, nr: usize| {
            let span = 4 * GEMM_VECTORS;
            let main = if vectorize { geo.n / span * span } else { 0 } as i64;
            let at = GemmAt {
                a0: a0.clone(),
                b0: b0.clone(),
                bidx: bidx.to_vec(),
                m0: m0.clone(),
            };
            kb.for_loop(0, main, span as i64, |kb, q| {
                gemm_tile(
                    kb,
                    &geo,
                    &bufs,
                    &epi,
                    &at,
                    nr,
                    &Affine::var(q),
                    GEMM_VECTORS,
                    Width::F32x4,
                    &out_strides,
                )
            });
            let vec_end = if vectorize {
                main + (geo.n as i64 - main) / 4 * 4
            } else {
                0
            };
            kb.for_loop(main, vec_end, 4, |kb, q| {
                gemm_tile(
                    kb,
                    &geo,
                    &bufs,
                    &epi,
                    &at,
                    nr,
                    &Affine::var(q),
                    1,
                    Width::F32x4,
                    &out_strides,
                )
            });
            kb.for_loop(vec_end, geo.n as i64, 1, |kb, q| {
                gemm_tile(
                    kb,
                    &geo,
                    &bufs,
                    &epi,
                    &at,
                    nr,
                    &Affine::var(q),
                    1,
                    Width::Scalar,
                    &out_strides,
                )
            });
        };
        kb.for_loop(0, rows_main as i64, GEMM_ROWS as i64, |kb, r| {
            row_block(kb, Affine::var(r), GEMM_ROWS)
        });
        kb.for_loop(rows_main as i64, geo.m as i64, 1, |kb, r| {
            row_block(kb, Affine::var(r), 1)
        });
    });
    cx.step(kb.finish(), args)
}

fn gemm_geo(g: &GemmAttrs, at: &TensorType, out: &TensorType) -> GemmGeo {
    let (m, k) = if g.trans_a {
        (at.dims[1], at.dims[0])
    } else {
        (at.dims[0], at.dims[1])
    };
    let n = out.dims[1];
    let (a_m, a_k) = if g.trans_a {
        (1, m as i64)
    } else {
        (k as i64, 1)
    };
    let (b_k, b_n) = if g.trans_b {
        (1, k as i64)
    } else {
        (n as i64, 1)
    };
    GemmGeo {
        batch: vec![],
        a_batch: vec![],
        b_batch: vec![],
        m,
        n,
        k,
        a_m,
        a_k,
        b_k,
        b_n,
        out_dims: out.dims.clone(),
        has_m: true,
        has_n: true,
        alpha: g.alpha.0,
        beta: g.beta.0,
    }
}

fn matmul_geo(at: &TensorType, bt: &TensorType, out: &TensorType) -> GemmGeo {
    let a2 = if at.rank() == 1 {
        vec![1, at.dims[0]]
    } else {
        at.dims.clone()
    };
    let b2 = if bt.rank() == 1 {
        vec![bt.dims[0], 1]
    } else {
        bt.dims.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let n = b2[b2.len() - 1];
    let has_m = at.rank() > 1;
    let has_n = bt.rank() > 1;
    let nb = out.rank() - has_m as usize - has_n as usize;
    let batch = out.dims[..nb].to_vec();
    // broadcast strides of each operand's batch dims against the result's batch dims
    let bstrides = |dims: &[usize]| {
        let batch_dims = &dims[..dims.len() - 2];
        let mat = (dims[dims.len() - 2] * dims[dims.len() - 1]) as i64;
        broadcast_strides(batch_dims, &batch)
            .into_iter()
            .map(|s| s * mat)
            .collect::<Vec<_>>()
    };
    GemmGeo {
        a_batch: bstrides(&a2),
        b_batch: bstrides(&b2),
        batch,
        m,
        n,
        k,
        a_m: k as i64,
        a_k: 1,
        b_k: n as i64,
        b_n: 1,
        out_dims: out.dims.clone(),
        has_m,
        has_n,
        alpha: 1.0,
        beta: 0.0,
    }
}

struct GemmBufs {
    a: BufId,
    b: BufId,
    c: Option<(BufId, Vec<i64>)>,
    out: BufId,
}

struct GemmAt {
    a0: Affine,
    b0: Affine,
    bidx: Vec<Affine>,
    m0: Affine,
}

/// A register tile of `nr` rows × `nv` groups of `w.lanes()` columns from column `q0`.
#[allow(clippy::too_many_arguments)]
fn gemm_tile(
    kb: &mut KernelBuilder,
    g: &GemmGeo,
    bufs: &GemmBufs,
    epi: &Epilogue,
    at: &GemmAt,
    nr: usize,
    q0: &Affine,
    nv: usize,
    w: Width,
    out_strides: &[i64],
) {
    let lanes = w.lanes() as i64;
    let accs: Vec<Vec<VarId>> = (0..nr)
        .map(|_| (0..nv).map(|_| kb.var(w)).collect())
        .collect();
    for row in &accs {
        for &acc in row {
            kb.assign(acc, Expr::constant(0.0, w));
        }
    }
    kb.for_loop(0, g.k as i64, 1, |kb, k| {
        let k = Affine::var(k);
        let bs: Vec<Expr> = (0..nv)
            .map(|j| {
                let col = q0.plus(j as i64 * lanes);
                let idx = at.b0.add(&k.scale(g.b_k)).add(&col.scale(g.b_n));
                let v = Expr::load(bufs.b, idx, w);
                if nr > 1 {
                    kb.let_(v, w)
                } else {
                    v
                }
            })
            .collect();
        for (r, row) in accs.iter().enumerate() {
            let m = at.m0.plus(r as i64);
            let ai = at.a0.add(&m.scale(g.a_m)).add(&k.scale(g.a_k));
            let av = Expr::splat_to(Expr::load(bufs.a, ai, Width::Scalar), w);
            let av = if nv > 1 { kb.let_(av, w) } else { av };
            for (j, &acc) in row.iter().enumerate() {
                kb.assign(acc, Expr::fma(av.clone(), bs[j].clone(), Expr::Var(acc)));
            }
        }
    });
    for (r, row) in accs.iter().enumerate() {
        for (j, &acc) in row.iter().enumerate() {
            let m = at.m0.plus(r as i64);
            let col = q0.plus(j as i64 * lanes);
            let mut v = Expr::Var(acc);
            if g.alpha != 1.0 {
                v = Expr::binary(BinOp::Mul, v, Expr::constant(g.alpha, w));
            }
            if let Some((c, strides)) = &bufs.c {
                if g.beta != 0.0 {
                    let cv = load_lanes(
                        *c,
                        index_of(strides, &[m.clone(), col.clone()]),
                        strides[1],
                        w,
                    );
                    v = Expr::fma(cv, Expr::constant(g.beta, w), v);
                }
            }
            let mut idx = at.bidx.clone();
            if g.has_m {
                idx.push(m.clone());
            }
            if g.has_n {
                idx.push(col.clone());
            }
            let v = epi.apply(kb, v, &idx, w);
            kb.store(bufs.out, index_of(out_strides, &idx), v, w);
        }
    }
}

/// `out[n] = α · Σ_k A[k] · B[n·b_n + k] (+ β · C[n])` for one row of A: `R` outputs (8,
/// else 4, 2 or 1, whatever divides them) per trip of the (parallel) loop, one f32x4
/// accumulator each over k (`R` independent FMA chains), reduced once. A stays in L1; B
/// streams once, `R` rows at a time: one 8 KB row at a time left the memory system idle
/// between rows (ResNet-50's classifier, 8 MB: 0.98–1.35 ms one row at a time, 0.76–0.98
/// four, 0.70–0.81 eight).
fn gemv_kernel(
    kb: &mut KernelBuilder,
    g: &GemmGeo,
    bufs: &GemmBufs,
    epi: &Epilogue,
    out_strides: &[i64],
) {
    let w4 = Width::F32x4;
    let rows = [8, 4, 2, 1]
        .into_iter()
        .find(|r| g.n.is_multiple_of(*r))
        .unwrap_or(1);
    let main = (g.k / 4 * 4) as i64;
    kb.set_parallel();
    kb.for_loop(0, (g.n / rows) as i64, 1, |kb, t| {
        let n0 = Affine::var(t).scale(rows as i64);
        let accs: Vec<VarId> = (0..rows).map(|_| kb.var(w4)).collect();
        for &acc in &accs {
            kb.assign(acc, Expr::constant(0.0, w4));
        }
        kb.for_loop(0, main, 4, |kb, k| {
            let k = Affine::var(k);
            let a = kb.let_(Expr::load(bufs.a, k.scale(g.a_k), w4), w4);
            for (r, &acc) in accs.iter().enumerate() {
                let b = Expr::load(bufs.b, n0.plus(r as i64).scale(g.b_n).add(&k), w4);
                kb.assign(acc, Expr::fma(a.clone(), b, Expr::Var(acc)));
            }
        });
        for (r, &acc) in accs.iter().enumerate() {
            let n = n0.plus(r as i64);
            let row = n.scale(g.b_n);
            let total = kb.var(Width::Scalar);
            kb.assign(total, Expr::Reduce(ReduceOp::Add, Box::new(Expr::Var(acc))));
            kb.for_loop(main, g.k as i64, 1, |kb, k| {
                let k = Affine::var(k);
                let a = Expr::load(bufs.a, k.scale(g.a_k), Width::Scalar);
                let b = Expr::load(bufs.b, row.add(&k), Width::Scalar);
                kb.assign(total, Expr::fma(a, b, Expr::Var(total)));
            });
            let s1 = Width::Scalar;
            let mut v = Expr::Var(total);
            if g.alpha != 1.0 {
                v = Expr::binary(BinOp::Mul, v, Expr::constant(g.alpha, s1));
            }
            let m = Affine::constant(0);
            if let Some((c, strides)) = &bufs.c {
                if g.beta != 0.0 {
                    let cv = Expr::load(*c, index_of(strides, &[m.clone(), n.clone()]), s1);
                    v = Expr::fma(cv, Expr::constant(g.beta, s1), v);
                }
            }
            let mut idx = Vec::new();
            if g.has_m {
                idx.push(m);
            }
            if g.has_n {
                idx.push(n);
            }
            let v = epi.apply(kb, v, &idx, s1);
            kb.store(bufs.out, index_of(out_strides, &idx), v, s1);
        }
    });
}

// ---------------------------------------------------------------------------------------
// Normalizations

/// layer_norm and softmax; post-ops are not supported on them here (the caller lowers a
/// fused layer_norm's post-ops as a separate elementwise kernel).
pub(crate) fn lower_norm(
    cx: &mut Cx,
    op: &Op,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if !epi.is_empty() {
        return Err(cx.unsupported("post-ops on a normalization"));
    }
    let dims = &out_ty.dims;
    let x = cx.buf(operands[0]);
    match op {
        Op::LayerNorm { axis, epsilon } => {
            let outer: usize = dims[..*axis].iter().product();
            let inner: usize = dims[*axis..].iter().product();
            let mut b = KernelBuilder::new(&format!("layer_norm_{outer}x{inner}"));
            let xa = b.arg("x", cx.len_of(x), Access::Read);
            let sb = cx.buf(operands[1]);
            let sa = b.arg("scale", cx.len_of(sb), Access::Read);
            let mut args = vec![x, sb];
            let ba = operands.get(2).map(|&v| {
                let bb = cx.buf(v);
                args.push(bb);
                b.arg("bias", cx.len_of(bb), Access::Read)
            });
            let ya = b.arg("out", cx.len_of(out), Access::Write);
            args.push(out);
            let inv_n = (1.0f64 / inner as f64) as f32;
            let eps = epsilon.0;
            b.for_loop(0, outer as i64, 1, |b, o| {
                let base = Affine::var(o).scale(inner as i64);
                let sum = sum_row(b, xa, &base, inner, 1, |e| e);
                let mean = b.let_(
                    Expr::binary(BinOp::Mul, sum, Expr::constant(inv_n, Width::Scalar)),
                    Width::Scalar,
                );
                let mean4 = b.let_(Expr::Splat(Box::new(mean.clone())), Width::F32x4);
                let sq = sum_row(b, xa, &base, inner, 1, |e| {
                    let m = match &e {
                        Expr::Load {
                            width: Width::F32x4,
                            ..
                        } => mean4.clone(),
                        _ => mean.clone(),
                    };
                    let d = Expr::binary(BinOp::Sub, e, m);
                    Expr::binary(BinOp::Mul, d.clone(), d)
                });
                let var = Expr::binary(BinOp::Mul, sq, Expr::constant(inv_n, Width::Scalar));
                let rstd = b.let_(
                    Expr::binary(
                        BinOp::Div,
                        Expr::constant(1.0, Width::Scalar),
                        Expr::unary(
                            UnOp::Sqrt,
                            Expr::binary(BinOp::Add, var, Expr::constant(eps, Width::Scalar)),
                        ),
                    ),
                    Width::Scalar,
                );
                emit_nest(b, &[inner], true, &mut |b, idx, w| {
                    let i = &idx[0];
                    let xv = Expr::load(xa, base.add(i), w);
                    let centered = Expr::binary(BinOp::Sub, xv, Expr::splat_to(mean.clone(), w));
                    let normed =
                        Expr::binary(BinOp::Mul, centered, Expr::splat_to(rstd.clone(), w));
                    let scaled = Expr::binary(BinOp::Mul, normed, Expr::load(sa, i.clone(), w));
                    let v = match ba {
                        Some(bb) => Expr::binary(BinOp::Add, scaled, Expr::load(bb, i.clone(), w)),
                        None => scaled,
                    };
                    b.store(ya, base.add(i), v, w);
                });
            });
            cx.step(b.finish(), args)
        }
        Op::Softmax { axis } => {
            let outer: usize = dims[..*axis].iter().product();
            let len = dims[*axis];
            let inner: usize = dims[*axis + 1..].iter().product();
            let mut b = KernelBuilder::new(&format!("softmax_{outer}x{len}x{inner}"));
            let xa = b.arg("x", cx.len_of(x), Access::Read);
            let ya = b.arg("out", cx.len_of(out), Access::Write);
            let args = vec![x, out];
            // lanes run along `inner` when it is long enough, else along the axis itself
            b.for_loop(0, outer as i64, 1, |b, o| {
                let base = Affine::var(o).scale((len * inner) as i64);
                if inner == 1 {
                    softmax_row(b, xa, ya, &base, len);
                } else {
                    emit_nest(b, &[inner], true, &mut |b, idx, w| {
                        softmax_strided(b, xa, ya, &base.add(&idx[0]), len, inner, w);
                    });
                }
            });
            cx.step(b.finish(), args)
        }
        _ => Err(cx.unsupported("not a normalization")),
    }
}

/// Softmax of `len` consecutive elements at `base`, vectorized along them.
fn softmax_row(b: &mut KernelBuilder, xa: BufId, ya: BufId, base: &Affine, len: usize) {
    let vec_end = (len / 4 * 4) as i64;
    let max = b.var(Width::Scalar);
    if vec_end > 0 {
        let m4 = b.var(Width::F32x4);
        b.assign(m4, Expr::load(xa, base.clone(), Width::F32x4));
        b.for_loop(4, vec_end, 4, |b, i| {
            let v = Expr::load(xa, base.add(&Affine::var(i)), Width::F32x4);
            b.assign(m4, Expr::binary(BinOp::Max, Expr::Var(m4), v));
        });
        b.assign(max, Expr::Reduce(ReduceOp::Max, Box::new(Expr::Var(m4))));
    } else {
        b.assign(max, Expr::load(xa, base.clone(), Width::Scalar));
    }
    b.for_loop(vec_end, len as i64, 1, |b, i| {
        let v = Expr::load(xa, base.add(&Affine::var(i)), Width::Scalar);
        b.assign(max, Expr::binary(BinOp::Max, Expr::Var(max), v));
    });
    let total = b.var(Width::Scalar);
    b.assign(total, Expr::constant(0.0, Width::Scalar));
    let max4 = b.let_(Expr::Splat(Box::new(Expr::Var(max))), Width::F32x4);
    if vec_end > 0 {
        let s4 = b.var(Width::F32x4);
        b.assign(s4, Expr::constant(0.0, Width::F32x4));
        b.for_loop(0, vec_end, 4, |b, i| {
            let at = base.add(&Affine::var(i));
            let x = Expr::load(xa, at.clone(), Width::F32x4);
            let e = b.let_(
                Expr::unary(UnOp::Exp, Expr::binary(BinOp::Sub, x, max4.clone())),
                Width::F32x4,
            );
            b.store(ya, at, e.clone(), Width::F32x4);
            b.assign(s4, Expr::binary(BinOp::Add, Expr::Var(s4), e));
        });
        b.assign(total, Expr::Reduce(ReduceOp::Add, Box::new(Expr::Var(s4))));
    }
    b.for_loop(vec_end, len as i64, 1, |b, i| {
        let at = base.add(&Affine::var(i));
        let x = Expr::load(xa, at.clone(), Width::Scalar);
        let e = b.let_(
            Expr::unary(UnOp::Exp, Expr::binary(BinOp::Sub, x, Expr::Var(max))),
            Width::Scalar,
        );
        b.store(ya, at, e.clone(), Width::Scalar);
        b.assign(total, Expr::binary(BinOp::Add, Expr::Var(total), e));
    });
    let inv = b.let_(
        Expr::binary(
            BinOp::Div,
            Expr::constant(1.0, Width::Scalar),
            Expr::Var(total),
        ),
        Width::Scalar,
    );
    emit_nest(b, &[len], true, &mut |b, idx, w| {
        let at = base.add(&idx[0]);
        let v = Expr::binary(
            BinOp::Mul,
            Expr::load(ya, at.clone(), w),
            Expr::splat_to(inv.clone(), w),
        );
        b.store(ya, at, v, w);
    });
}

/// Softmax along an axis of stride `inner`, for `w.lanes()` neighbouring positions at once.
fn softmax_strided(
    b: &mut KernelBuilder,
    xa: BufId,
    ya: BufId,
    base: &Affine,
    len: usize,
    inner: usize,
    w: Width,
) {
    let at = |j: &Affine| base.add(&j.scale(inner as i64));
    let max = b.var(w);
    b.assign(max, Expr::load(xa, base.clone(), w));
    b.for_loop(1, len as i64, 1, |b, j| {
        let v = Expr::load(xa, at(&Affine::var(j)), w);
        b.assign(max, Expr::binary(BinOp::Max, Expr::Var(max), v));
    });
    let total = b.var(w);
    b.assign(total, Expr::constant(0.0, w));
    b.for_loop(0, len as i64, 1, |b, j| {
        let p = at(&Affine::var(j));
        let x = Expr::load(xa, p.clone(), w);
        let e = b.let_(
            Expr::unary(UnOp::Exp, Expr::binary(BinOp::Sub, x, Expr::Var(max))),
            w,
        );
        b.store(ya, p, e.clone(), w);
        b.assign(total, Expr::binary(BinOp::Add, Expr::Var(total), e));
    });
    let inv = b.let_(
        Expr::binary(BinOp::Div, Expr::constant(1.0, w), Expr::Var(total)),
        w,
    );
    b.for_loop(0, len as i64, 1, |b, j| {
        let p = at(&Affine::var(j));
        let v = Expr::binary(BinOp::Mul, Expr::load(ya, p.clone(), w), inv.clone());
        b.store(ya, p, v, w);
    });
}

// ---------------------------------------------------------------------------------------
// Data movement

/// Copies `dims` elements from `src` (element strides `src_st`, offset `src_off`) to `dst`
/// (strides `dst_st`, offset `dst_off`), vectorized along the last merged dimension when
/// both sides are contiguous there.
fn copy_nest(
    b: &mut KernelBuilder,
    dims: &[usize],
    (src, src_st, src_off): (BufId, &[i64], i64),
    (dst, dst_st, dst_off): (BufId, &[i64], i64),
) {
    if dims.contains(&0) {
        return;
    }
    let (cd, st) = collapse(dims, &[src_st.to_vec(), dst_st.to_vec()]);
    let vectorize = st.iter().all(|s| s.last() == Some(&1));
    emit_nest(b, &cd, vectorize, &mut |b, idx, w| {
        let v = Expr::load(src, index_of(&st[0], idx).plus(src_off), w);
        b.store(dst, index_of(&st[1], idx).plus(dst_off), v, w);
    });
}

/// transpose, concat, reorder (row-major ↔ blocked), and reshape/flatten copies.
pub(crate) fn lower_copy(
    cx: &mut Cx,
    op: &Op,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if !epi.is_empty() {
        return Err(cx.unsupported("post-ops on a data movement op"));
    }
    let out_dims = &out_ty.dims;
    let mut b = KernelBuilder::new(&format!("{}_{}", op.name(), dims_name(out_dims)));
    let mut args = Vec::new();
    let srcs: Vec<BufId> = operands
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let buf = cx.buf(v);
            args.push(buf);
            b.arg(&format!("in{i}"), cx.len_of(buf), Access::Read)
        })
        .collect();
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let out_st = row_major_strides(out_dims);
    match op {
        Op::Transpose { perm } => {
            let in_st = row_major_strides(&cx.func.type_of(operands[0]).dims);
            let src_st: Vec<i64> = perm.iter().map(|&p| in_st[p]).collect();
            copy_nest(&mut b, out_dims, (srcs[0], &src_st, 0), (ya, &out_st, 0));
        }
        Op::Concat { axis } => {
            let mut offset = 0i64;
            for (i, &v) in operands.iter().enumerate() {
                let d = cx.func.type_of(v).dims.clone();
                let st = row_major_strides(&d);
                let at = offset * out_st[*axis];
                copy_nest(&mut b, &d, (srcs[i], &st, 0), (ya, &out_st, at));
                offset += d[*axis] as i64;
            }
        }
        Op::Reshape { .. } | Op::Flatten { .. } => {
            let n = out_ty.num_elements();
            copy_nest(&mut b, &[n], (srcs[0], &[1], 0), (ya, &[1], 0));
        }
        Op::Reorder { layout } => {
            let from = cx.func.type_of(operands[0]).clone();
            reorder(&mut b, &from, *layout, srcs[0], ya, cx.len_of(out))
                .map_err(|m| cx.unsupported(m))?;
        }
        _ => return Err(cx.unsupported("not a data movement op")),
    }
    cx.step(b.finish(), args)
}

/// Element strides of a tensor of logical `dims` stored in `layout`, over "split" dims:
/// the logical dims with the blocked axis split into (block index, lane), the lane last.
fn split_strides(dims: &[usize], layout: Layout, axis: usize, block: usize) -> Vec<i64> {
    let mut split: Vec<usize> = dims.to_vec();
    split[axis] = dims[axis].div_ceil(block);
    match layout {
        Layout::RowMajor => {
            let st = row_major_strides(dims);
            let mut s = st.clone();
            s[axis] = st[axis] * block as i64;
            s.push(st[axis]);
            s
        }
        Layout::Blocked { .. } => {
            split.push(block);
            row_major_strides(&split)
        }
    }
}

/// Copies between row-major and a blocked layout; padding lanes of a blocked result are zero.
fn reorder(
    b: &mut KernelBuilder,
    from: &TensorType,
    to: Layout,
    src: BufId,
    dst: BufId,
    dst_len: usize,
) -> Result<(), String> {
    let dims = &from.dims;
    let (blocked, axis, block) = match (from.layout, to) {
        (l1, l2) if l1 == l2 => {
            copy_nest(b, &[dst_len], (src, &[1], 0), (dst, &[1], 0));
            return Ok(());
        }
        (Layout::RowMajor, Layout::Blocked { axis, block }) => (to, axis, block),
        (Layout::Blocked { axis, block }, Layout::RowMajor) => (from.layout, axis, block),
        _ => return Err("reorder between two blocked layouts".into()),
    };
    let (axis, block) = (axis as usize, block as usize);
    let (src_layout, dst_layout) = if to == blocked {
        (Layout::RowMajor, blocked)
    } else {
        (blocked, Layout::RowMajor)
    };
    if to == blocked {
        // zero the padding lanes (and everything else, overwritten below)
        let main = (dst_len / 4 * 4) as i64;
        b.for_loop(0, main, 4, |b, i| {
            b.store(
                dst,
                Affine::var(i),
                Expr::constant(0.0, Width::F32x4),
                Width::F32x4,
            )
        });
        b.for_loop(main, dst_len as i64, 1, |b, i| {
            b.store(
                dst,
                Affine::var(i),
                Expr::constant(0.0, Width::Scalar),
                Width::Scalar,
            )
        });
    }
    let s_st = split_strides(dims, src_layout, axis, block);
    let d_st = split_strides(dims, dst_layout, axis, block);
    let full = dims[axis] / block;
    let rest = dims[axis] % block;
    // full blocks, then the partial last block
    let mut split: Vec<usize> = dims.to_vec();
    split[axis] = full;
    split.push(block);
    copy_nest(b, &split, (src, &s_st, 0), (dst, &d_st, 0));
    if rest > 0 {
        let mut split: Vec<usize> = dims.to_vec();
        split[axis] = 1;
        split.push(rest);
        let off = |st: &[i64]| st[axis] * full as i64;
        copy_nest(
            b,
            &split,
            (src, &s_st, off(&s_st)),
            (dst, &d_st, off(&d_st)),
        );
    }
    Ok(())
}
