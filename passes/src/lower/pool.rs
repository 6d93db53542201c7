//! Lowerings of pools: max_pool2d, avg_pool2d and global_avg_pool, and the halving 3×3
//! max pool on NCHW or channel blocks.

use smelt_ir::loops::{Access, Affine, BinOp, CmpOp, Expr, KernelBuilder, VarId, Width};
use smelt_ir::op::Pool2dAttrs;
use smelt_ir::{Diagnostic, Layout, Op, TensorType, Value};

use super::conv::{pad_kernel, CHANNEL_BLOCK, CHANNEL_BLOCKS};
use super::elementwise::{dims_name, Epilogue};
use super::norm::sum_row;
use super::{BufferId, Cx};
use crate::blocks::{halves_with_3x3_windows, max_pool_on_blocks};

/// Windows of up to this many taps are unrolled whole; larger ones loop over their rows.
const MAX_UNROLLED_TAPS: usize = 64;

/// The most bytes of one plane's row maxima a max pool keeps on its stack (a padded
/// input row's max at every output column): 16 KiB, a 64-row plane 64 wide.
const ROW_MAXIMA_MAX_BYTES: usize = 16 << 10;

/// The pools [`lower_pool`] computes, as the lowering dispatch hands them over (so its
/// match is exhaustive).
#[derive(Clone, Copy, Debug)]
pub(crate) enum PoolOp<'a> {
    /// `max_pool2d`.
    Max(&'a Pool2dAttrs),
    /// `avg_pool2d`.
    Avg {
        /// The window.
        pool: &'a Pool2dAttrs,
        /// Divide by the full window (true) or the input elements in it (false).
        count_include_pad: bool,
    },
    /// `global_avg_pool`.
    GlobalAvg,
}

/// max_pool2d, avg_pool2d and global_avg_pool over NCHW (and the halving 3×3 max pool
/// and global_avg_pool over channel blocks), with post-ops in registers.
pub(crate) fn lower_pool(
    cx: &mut Cx,
    op: PoolOp,
    operands: &[Value],
    out_ty: &TensorType,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let xt = cx.func.type_of(operands[0]).clone();
    let x = cx.buf(operands[0]);
    let (p, is_max, include_pad) = match op {
        PoolOp::Max(p) => (p.clone(), true, false),
        PoolOp::Avg {
            pool,
            count_include_pad,
        } => (pool.clone(), false, count_include_pad),
        PoolOp::GlobalAvg => return global_avg_pool(cx, &xt, x, out_ty, epi, out),
    };
    // the op as the IR writes it, for the block predicates and the kernel's name
    let as_op = if is_max {
        Op::MaxPool2d(p.clone())
    } else {
        Op::AvgPool2d {
            pool: p.clone(),
            count_include_pad: include_pad,
        }
    };
    if xt.rank() != 4 {
        return Err(cx.unsupported("pools take rank-4 NCHW input"));
    }
    let [n, c, h, w] = [xt.dims[0], xt.dims[1], xt.dims[2], xt.dims[3]];
    let [oh, ow] = [out_ty.dims[2], out_ty.dims[3]];
    if xt.layout != Layout::RowMajor || out_ty.layout != Layout::RowMajor {
        if !max_pool_on_blocks(&as_op, &xt, out_ty) || !epi.runs_along_channels() {
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
        as_op.name(),
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
    // `acc` takes the max with (or adds) `v`. NaN propagates in a max (as the interpreter
    // defines): `max(v, acc)` keeps a NaN accumulator, and the select lets a NaN input
    // (v >= v fails) win.
    let accumulate = |b: &mut KernelBuilder, acc: VarId, v: Expr, wd: Width| {
        if is_max {
            let v = b.let_(v, wd);
            let m = Expr::binary(BinOp::Max, v.clone(), Expr::Var(acc));
            let keep = Expr::select(CmpOp::Ge, v.clone(), v.clone(), m, v);
            b.assign(acc, keep);
        } else {
            b.assign(acc, Expr::binary(BinOp::Add, Expr::Var(acc), v));
        }
    };
    // one window row of input row `row` at output column `q` into `acc`: its taps
    // unrolled (their column phases are compile-time)
    let row_taps =
        |b: &mut KernelBuilder, acc: VarId, np: &Affine, row: &Affine, q: &Affine, wd| {
            for kx in 0..kw {
                let col = kx * dw;
                let (phase, shift) = (col % sw, col / sw);
                let idx = np
                    .scale((hp * sw * wq) as i64)
                    .add(&row.scale((sw * wq) as i64))
                    .add(&q.plus((phase * wq + shift) as i64));
                accumulate(b, acc, Expr::load(xa, idx, wd), wd);
            }
        };
    // A max over a window is the max over its rows of each row's max, so a max pool
    // whose row maxima of one plane fit a stack buffer takes them first (every input row
    // at every output column), then combines `kh` of them per output: kh + kw taps per
    // output instead of kh · kw (the 5×5 pools of YOLO's SPP block: 10 instead of 25).
    let row_maxima = (is_max && kh > 1 && kw > 1 && hp * ow * 4 <= ROW_MAXIMA_MAX_BYTES)
        .then(|| b.local(hp * ow));
    let window = |b: &mut KernelBuilder, np: &Affine, r: &Affine, q: &Affine, wd: Width| {
        let acc = b.var(wd);
        b.assign(acc, Expr::constant(fill, wd));
        let top = r.scale(sh as i64);
        if let Some(rows) = row_maxima {
            for ky in 0..kh {
                let row = top.plus((ky * dh) as i64);
                let v = Expr::load(rows, row.scale(ow as i64).add(q), wd);
                accumulate(b, acc, v, wd);
            }
        } else if kh * kw <= MAX_UNROLLED_TAPS {
            for ky in 0..kh {
                row_taps(b, acc, np, &top.plus((ky * dh) as i64), q, wd);
            }
        } else {
            // a large window walks its rows in a loop: unrolled, its thousands of taps
            // made one function that took Cranelift many seconds to compile
            b.for_loop(0, kh as i64, 1, |b, ky| {
                let row = top.add(&Affine::var(ky).scale(dh as i64));
                row_taps(b, acc, np, &row, q, wd);
            });
        }
        acc
    };
    // every output column of a row, as vectors of 4 and a scalar tail
    let columns = |b: &mut KernelBuilder,
                   emit: &mut dyn FnMut(&mut KernelBuilder, Affine, Width)| {
        let vec_end = (ow / 4 * 4) as i64;
        b.for_loop(0, vec_end, 4, |b, q| emit(b, Affine::var(q), Width::F32x4));
        b.for_loop(vec_end, ow as i64, 1, |b, q| {
            emit(b, Affine::var(q), Width::Scalar)
        });
    };
    // channels outermost: split across threads
    b.set_parallel();
    b.for_loop(0, c as i64, 1, |b, ci| {
        b.for_loop(0, n as i64, 1, |b, ni| {
            let np = Affine::var(ni).scale(c as i64).add(&Affine::var(ci));
            if let Some(rows) = row_maxima {
                b.for_loop(0, hp as i64, 1, |b, row| {
                    let row = Affine::var(row);
                    columns(b, &mut |b, q, wd| {
                        let acc = b.var(wd);
                        b.assign(acc, Expr::constant(fill, wd));
                        row_taps(b, acc, &np, &row, &q, wd);
                        b.store(rows, row.scale(ow as i64).add(&q), Expr::Var(acc), wd);
                    });
                });
            }
            b.for_loop(0, oh as i64, 1, |b, r| {
                let r = Affine::var(r);
                columns(b, &mut |b, q, wd| {
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
                });
            });
        });
    });
    cx.step(b.finish(), args)
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
        // result's 4 consecutive channels; a partial last block (channels a multiple of
        // 4) sums only its real vectors
        let unit = CHANNEL_BLOCK as i64;
        let w4 = Width::F32x4;
        if !c.is_multiple_of(4) {
            return Err(cx.unsupported("channel blocks of a channel count not a multiple of 4"));
        }
        let stored = c.div_ceil(CHANNEL_BLOCK) as i64;
        // the means of the first `channels` channels of block `cb` of image `ni`
        let block_means = |b: &mut KernelBuilder, ni: &Affine, cb: &Affine, channels: usize| {
            let block = ni.scale(stored).add(cb);
            for quad in (0..channels as i64).step_by(4) {
                let acc = b.var(w4);
                b.assign(acc, Expr::constant(0.0, w4));
                let base = block.scale(unit * inner as i64).plus(quad);
                b.for_loop(0, inner as i64, 1, |b, p| {
                    let at = base.add(&Affine::var(p).scale(unit));
                    let v = Expr::binary(BinOp::Add, Expr::Var(acc), Expr::load(xa, at, w4));
                    b.assign(acc, v);
                });
                let mean = Expr::binary(BinOp::Mul, Expr::Var(acc), Expr::constant(scale, w4));
                let channel = cb.scale(unit).plus(quad);
                let mut idx = vec![ni.clone(), channel.clone()];
                idx.resize(rank, Affine::constant(0));
                // the result is [n][c] (1×1 planes): element n·c + channel
                let stored_at = ni.scale(c as i64).add(&channel);
                let v = epi.apply_along_channels(b, mean, &idx, &stored_at, w4);
                b.store(ya, stored_at, v, w4);
            }
        };
        b.for_loop(0, n as i64, 1, |b, ni| {
            let ni = Affine::var(ni);
            b.for_blocks(c, CHANNEL_BLOCK, |b, cb, channels| {
                block_means(b, &ni, cb, channels)
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
