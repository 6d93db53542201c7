//! Depthwise 3×3 convolutions (one channel per group, stride 1, padding 1) straight from
//! the NCHW input: no padded copy, which was a third of the depthwise residual tail's
//! time (0.52 of 1.34 ms at 256·56²: the copy moves as many bytes as the conv).
//!
//! Each output row is the sum over its 2–3 input rows of three taps, on vectors of 4
//! columns: the centre tap is the row's vector, the left and right taps are the same
//! vector shifted by one lane, filled in from the previous and the next vector (carried
//! from one step to the next, zero past the row's ends).

use smelt_ir::loops::{
    Affine, BinOp, BufPtr, DepthwiseRow, Expr, KernelBuilder, TileTarget, VarId, Width,
    DEPTHWISE_MAX_TAPS,
};
use smelt_ir::{Diagnostic, Value};

use super::{Geo, TileBufs};
use crate::lower::elementwise::{dims_name, Epilogue};
use crate::lower::{BufferId, Cx};

/// Whether `g` is a depthwise 3×3 convolution this kernel computes: one input and one
/// output channel per group, stride 1, dilation 1, one pixel of padding on every side
/// (`pads`), at least 2 rows and whole vectors of 4 columns.
pub(super) fn applies(g: &Geo, pads: [usize; 4]) -> bool {
    g.groups == g.c
        && g.o == g.c
        && g.cg == 1
        && (g.kh, g.kw) == (3, 3)
        && g.stride == [1, 1]
        && g.dil == [1, 1]
        && pads == [1; 4]
        && g.oh >= 2
        && g.ow.is_multiple_of(4)
}

/// The kernel: parallel over channels; per image and output row, one pass along the row.
pub(super) fn kernel(
    cx: &mut Cx,
    g: &Geo,
    x: BufferId,
    operands: &[Value],
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let (h, w) = (g.oh, g.ow);
    let mut b = KernelBuilder::new(&format!(
        "conv2d_depthwise3x3_{}{}{}",
        dims_name(&[g.n, g.c, h, w]),
        if operands.len() > 2 { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" }
    ));
    let wbuf = cx.buf(operands[1]);
    let (bufs, args) = TileBufs::declare(&mut b, cx, x, ("w", wbuf), operands, &mut epi, out);
    let (xa, wa, bias, ya) = (bufs.x, bufs.w, bufs.bias, bufs.out);
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    let plane = (h * w) as i64;
    let c = g.c as i64;
    b.set_parallel();
    b.for_loop(0, c, 1, |b, ci| {
        let ci = Affine::var(ci);
        // the channel's 9 weights, splat once
        let taps: Vec<Expr> = (0..9)
            .map(|k| {
                let v = Expr::load(wa, ci.scale(9).plus(k), s1);
                b.let_(Expr::splat_to(v, w4), w4)
            })
            .collect();
        let bias_v = bias.map(|bb| {
            let v = Expr::load(bb, ci.clone(), s1);
            b.let_(Expr::splat_to(v, w4), w4)
        });
        b.for_loop(0, g.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            let base = n.scale(c * plane).add(&ci.scale(plane));
            // output row `r` from input rows `r + dy` for the kernel rows `ky` listed
            let row = |b: &mut KernelBuilder, r: &Affine, rows: &[(i64, usize)]| {
                let at = |dy: i64, col: &Affine| base.add(&r.plus(dy).scale(w as i64)).add(col);
                // per kernel row: the vector left of the current one, and the current one
                let carried: Vec<(VarId, VarId)> = rows
                    .iter()
                    .map(|&(dy, _)| {
                        let (prev, cur) = (b.var(w4), b.var(w4));
                        b.assign(prev, Expr::constant(0.0, w4));
                        b.assign(cur, Expr::load(xa, at(dy, &Affine::constant(0)), w4));
                        (prev, cur)
                    })
                    .collect();
                // one vector of output columns from `q`, with `next(dy)` the input right of it
                let step = |b: &mut KernelBuilder, q: &Affine, last: bool| {
                    let mut acc = bias_v.clone().unwrap_or(Expr::constant(0.0, w4));
                    for (&(dy, ky), &(prev, cur)) in rows.iter().zip(&carried) {
                        let next = if last {
                            Expr::constant(0.0, w4)
                        } else {
                            Expr::load(xa, at(dy, &q.plus(4)), w4)
                        };
                        let next = b.let_(next, w4);
                        let (p, cv) = (Expr::Var(prev), Expr::Var(cur));
                        let left = Expr::shuffle(p, cv.clone(), [3, 4, 5, 6]);
                        let right = Expr::shuffle(cv.clone(), next.clone(), [1, 2, 3, 4]);
                        let tap = |kx: usize| taps[3 * ky + kx].clone();
                        acc = Expr::fma(left, tap(0), acc);
                        acc = Expr::fma(cv.clone(), tap(1), acc);
                        acc = b.let_(Expr::fma(right, tap(2), acc), w4);
                        if !last {
                            b.assign(prev, cv);
                            b.assign(cur, next);
                        }
                    }
                    let idx = [n.clone(), ci.clone(), r.clone(), q.clone()];
                    let v = epi.apply(b, acc, &idx, w4);
                    b.store(ya, base.add(&r.scale(w as i64)).add(q), v, w4);
                };
                let last = (w - 4) as i64;
                b.for_loop(0, last, 4, |b, q| step(b, &Affine::var(q), false));
                step(b, &Affine::constant(last), true);
            };
            row(b, &Affine::constant(0), &[(0, 1), (1, 2)]);
            b.for_loop(1, h as i64 - 1, 1, |b, r| {
                row(b, &Affine::var(r), &[(-1, 0), (0, 1), (1, 2)])
            });
            row(b, &Affine::constant(h as i64 - 1), &[(-1, 0), (0, 1)]);
        });
    });
    cx.step(b.finish(), args)
}

/// Whether `g` is a depthwise convolution the native depthwise-row routine computes on
/// `micro`'s ISA: one input and output channel per group, kernels from 5 to
/// [`DEPTHWISE_MAX_TAPS`] wide, output rows of at least one routine vector (shorter rows
/// are mostly call overhead; the Cranelift kernels keep them).
///
/// Measured (1 thread, Zen 5, benches/RESULTS.md session 14): 5×5 kernels run 3–4×
/// faster than on Cranelift's kernels (120 channels at 80²: 1.81 → 0.49 ms; stride 2 at
/// 160²: 1.79 → 0.33 ms), while 3×3 ones gain nothing — 256 channels at 56² and stride 2
/// at 80² tie — or lose: stride 2 at 320² (26 MB of padded input) 1.03 → 2.39 ms. So
/// 3×3 kernels keep the Cranelift paths.
pub(super) fn rows_apply(g: &Geo, micro: Option<TileTarget>) -> bool {
    micro.is_some_and(|t| g.ow >= t.fma_lanes as usize)
        && g.groups == g.c
        && g.o == g.c
        && g.cg == 1
        && (5..=DEPTHWISE_MAX_TAPS).contains(&g.kw)
        && g.kh >= 1
}

/// The depthwise convolution on the depthwise-row routine: per channel (the parallel
/// loop), image and output row, one call sums the row's `kh × kw` taps from the padded,
/// phase-split input `xp` (each tap a run of one phase, see `Geo::x_index`) into a stack
/// buffer, and the epilogue adds the bias, applies the post-ops and stores the row.
pub(super) fn rows_kernel(
    cx: &mut Cx,
    g: &Geo,
    xp: BufferId,
    operands: &[Value],
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let mut b = KernelBuilder::new(&format!(
        "conv2d_depthwise_rows_{}_{}{}{}",
        dims_name(&[g.n, g.c, g.hp, g.phases * g.wq]),
        g.window_name(),
        if operands.len() > 2 { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" }
    ));
    let wbuf = cx.buf(operands[1]);
    let (bufs, args) = TileBufs::declare(&mut b, cx, xp, ("w", wbuf), operands, &mut epi, out);
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    let mut tap_offsets = [0i64; DEPTHWISE_MAX_TAPS];
    for (kx, o) in tap_offsets.iter_mut().enumerate().take(g.kw) {
        let col = kx * g.dil[1];
        *o = ((col % g.phases) * g.wq + col / g.phases) as i64;
    }
    let row = DepthwiseRow {
        cols: g.ow as i64,
        rows: g.kh as i64,
        row_stride: (g.dil[0] * g.phases * g.wq) as i64,
        taps: g.kw as i64,
        tap_offsets,
    };
    let sums = b.local(g.ow);
    let (c, oh, ow) = (g.c as i64, g.oh as i64, g.ow as i64);
    b.set_parallel();
    b.for_loop(0, c, 1, |b, ci| {
        let ci = Affine::var(ci);
        let bias = bufs.bias.map(|bb| {
            let v = Expr::load(bb, ci.clone(), s1);
            (b.let_(Expr::splat_to(v.clone(), w4), w4), v)
        });
        b.for_loop(0, g.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            b.for_loop(0, oh, 1, |b, oy| {
                let oy = Affine::var(oy);
                let zero = Affine::constant(0);
                let x_at = g.x_index(&n, &ci, &oy.scale(g.stride[0] as i64), 0, &zero);
                b.depthwise_row(
                    BufPtr {
                        buf: bufs.x,
                        index: x_at,
                    },
                    BufPtr {
                        buf: bufs.w,
                        index: ci.scale((g.kh * g.kw) as i64),
                    },
                    BufPtr {
                        buf: sums,
                        index: zero.clone(),
                    },
                    row,
                );
                let out_at = |q: &Affine| n.scale(c).add(&ci).scale(oh).add(&oy).scale(ow).add(q);
                let finish = |b: &mut KernelBuilder, q: &Affine, w: Width| {
                    let s = Expr::load(sums, q.clone(), w);
                    let s = match &bias {
                        Some((v4, v1)) => {
                            let bv = if w == s1 { v1.clone() } else { v4.clone() };
                            Expr::binary(BinOp::Add, s, bv)
                        }
                        None => s,
                    };
                    let idx = [n.clone(), ci.clone(), oy.clone(), q.clone()];
                    let v = epi.apply(b, s, &idx, w);
                    b.store(bufs.out, out_at(q), v, w);
                };
                let whole = ow / 4 * 4;
                b.for_loop(0, whole, 4, |b, q| finish(b, &Affine::var(q), w4));
                b.for_loop(whole, ow, 1, |b, q| finish(b, &Affine::var(q), s1));
            });
        });
    });
    cx.step(b.finish(), args)
}
