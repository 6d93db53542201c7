//! Lowering of `conv_transpose2d` as a scatter: every input pixel adds `x * w` onto its
//! strided window of an uncropped result, then one pass crops the pads and adds the bias.
//!
//! Why a scatter into an uncropped buffer: there, every tap of every input pixel lands
//! inside (the buffer is exactly as large as the last tap of the last pixel reaches, plus
//! the output padding), so all loops have constant bounds and all addresses are affine —
//! no guards, no run-time index, and `Kernel::check` proves every access. A gather by
//! output pixel would need per-tap ranges that differ by the output's phase modulo the
//! stride. The price is the cropped border (`pads` rows and columns), written and dropped.
//!
//! Vectors: with column stride 1 an input row and its landing row are both contiguous,
//! so the scatter runs on vectors of 4 columns; with larger strides the landing columns
//! are strided and it runs on scalars. The crop pass is contiguous along the output rows
//! and runs on vectors (post-ops, if any, are applied there).

use smelt_ir::loops::{Access, Affine, BinOp, Expr, KernelBuilder, LoopVar, Width};
use smelt_ir::op::ConvTranspose2dAttrs;
use smelt_ir::{Diagnostic, Layout, TensorType, Value};

use super::elementwise::{dims_name, Epilogue};
use super::{BufferId, Cx};

/// The geometry of one transposed convolution, in elements.
struct Geometry {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    /// Output channels.
    o: usize,
    /// Output channels per group.
    og: usize,
    /// Input channels per group.
    cg: usize,
    groups: usize,
    kh: usize,
    kw: usize,
    /// The uncropped result's rows and columns.
    full: [usize; 2],
    /// The result's rows and columns.
    out: [usize; 2],
}

/// `conv_transpose2d(x, w, bias?)` with post-ops applied in the crop pass.
pub(crate) fn lower_conv_transpose2d(
    cx: &mut Cx,
    a: &ConvTranspose2dAttrs,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let xt = cx.func.type_of(operands[0]).clone();
    let wt = cx.func.type_of(operands[1]).clone();
    if [&xt, &wt, out_ty]
        .iter()
        .any(|t| t.layout != Layout::RowMajor)
    {
        return Err(cx.unsupported("conv_transpose2d on channel blocks"));
    }
    let [n, c, h, w] = [xt.dims[0], xt.dims[1], xt.dims[2], xt.dims[3]];
    let [kh, kw] = [wt.dims[2], wt.dims[3]];
    let (Some(full_h), Some(full_w)) = (a.full_size(0, h, kh), a.full_size(1, w, kw)) else {
        return Err(cx.unsupported("a conv_transpose2d whose result size overflows"));
    };
    let g = Geometry {
        n,
        c,
        h,
        w,
        o: out_ty.dims[1],
        og: wt.dims[1],
        cg: c / a.groups,
        groups: a.groups,
        kh,
        kw,
        full: [full_h, full_w],
        out: [out_ty.dims[2], out_ty.dims[3]],
    };
    let full = cx.temp("uncropped", n * g.o * full_h * full_w);
    scatter(cx, a, &g, operands, full)?;
    crop(cx, a, &g, operands, full, epi, out)
}

/// `full[n, oc, iy*sh + ky*dh, ix*sw + kx*dw] += x[n, c, iy, ix] * w[c, o, ky, kx]` over
/// every input pixel and tap, after zeroing each (image, output channel) plane. Parallel
/// over whichever of output channels per group and groups is larger, so depthwise
/// (one output channel per group) and ungrouped ones both split.
fn scatter(
    cx: &mut Cx,
    a: &ConvTranspose2dAttrs,
    g: &Geometry,
    operands: &[Value],
    full: BufferId,
) -> Result<(), Diagnostic> {
    let (x, wbuf) = (cx.buf(operands[0]), cx.buf(operands[1]));
    let [sh, sw] = a.strides;
    let [dh, dw] = a.dilations;
    let [fh, fw] = g.full;
    let mut b = KernelBuilder::new(&format!(
        "conv_transpose2d_scatter_{}_o{}_g{}_k{}x{}_s{sh}x{sw}_d{dh}x{dw}",
        dims_name(&[g.n, g.c, g.h, g.w]),
        g.o,
        g.groups,
        g.kh,
        g.kw,
    ));
    let xa = b.arg("x", cx.len_of(x), Access::Read);
    let wa = b.arg("w", cx.len_of(wbuf), Access::Read);
    let fa = b.arg("uncropped", cx.len_of(full), Access::Write);
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    // the body for output channel `o` of group `gi`
    let body = |b: &mut KernelBuilder, o: LoopVar, gi: LoopVar| {
        let (o, gi) = (Affine::var(o), Affine::var(gi));
        let oc = gi.scale(g.og as i64).add(&o);
        b.for_loop(0, g.n as i64, 1, |b, ni| {
            let ni = Affine::var(ni);
            let plane = ni.scale(g.o as i64).add(&oc).scale((fh * fw) as i64);
            let plane_len = (fh * fw) as i64;
            let vec_end = plane_len / 4 * 4;
            b.for_loop(0, vec_end, 4, |b, i| {
                let at = plane.add(&Affine::var(i));
                b.store(fa, at, Expr::constant(0.0, w4), w4);
            });
            b.for_loop(vec_end, plane_len, 1, |b, i| {
                let at = plane.add(&Affine::var(i));
                b.store(fa, at, Expr::constant(0.0, s1), s1);
            });
            b.for_loop(0, g.cg as i64, 1, |b, ci| {
                let ch = gi.scale(g.cg as i64).add(&Affine::var(ci));
                let x_plane = ni.scale(g.c as i64).add(&ch).scale((g.h * g.w) as i64);
                let taps = ch.scale(g.og as i64).add(&o).scale((g.kh * g.kw) as i64);
                b.for_loop(0, g.kh as i64, 1, |b, ky| {
                    b.for_loop(0, g.kw as i64, 1, |b, kx| {
                        let (ky, kx) = (Affine::var(ky), Affine::var(kx));
                        let tap = taps.add(&ky.scale(g.kw as i64)).add(&kx);
                        let weight = b.let_(Expr::load(wa, tap, s1), s1);
                        let weight4 = b.let_(Expr::splat_to(weight.clone(), w4), w4);
                        b.for_loop(0, g.h as i64, 1, |b, iy| {
                            let iy = Affine::var(iy);
                            let x_row = x_plane.add(&iy.scale(g.w as i64));
                            let row = iy.scale(sh as i64).add(&ky.scale(dh as i64));
                            let f_row = plane.add(&row.scale(fw as i64)).add(&kx.scale(dw as i64));
                            let add = |b: &mut KernelBuilder, ix: Affine, wd: Width| {
                                let src = Expr::load(xa, x_row.add(&ix), wd);
                                let dst = f_row.add(&ix.scale(sw as i64));
                                let k = if wd == w4 { &weight4 } else { &weight };
                                let sum =
                                    Expr::fma(src, k.clone(), Expr::load(fa, dst.clone(), wd));
                                b.store(fa, dst, sum, wd);
                            };
                            // stride-1 columns land contiguously: vectors of 4
                            let vec_end = if sw == 1 { (g.w / 4 * 4) as i64 } else { 0 };
                            b.for_loop(0, vec_end, 4, |b, ix| add(b, Affine::var(ix), w4));
                            b.for_loop(vec_end, g.w as i64, 1, |b, ix| add(b, Affine::var(ix), s1));
                        });
                    });
                });
            });
        });
    };
    b.set_parallel();
    if g.og >= g.groups {
        b.for_loop(0, g.og as i64, 1, |b, o| {
            b.for_loop(0, g.groups as i64, 1, |b, gi| body(b, o, gi));
        });
    } else {
        b.for_loop(0, g.groups as i64, 1, |b, gi| {
            b.for_loop(0, g.og as i64, 1, |b, o| body(b, o, gi));
        });
    }
    cx.step(b.finish(), vec![x, wbuf, full])
}

/// `out[n, o, y, x] = full[n, o, y + pad_top, x + pad_left] + bias[o]`, then the
/// post-ops; vectors of 4 along each output row. Parallel over output channels.
fn crop(
    cx: &mut Cx,
    a: &ConvTranspose2dAttrs,
    g: &Geometry,
    operands: &[Value],
    full: BufferId,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let [fh, fw] = g.full;
    let [oh, ow] = g.out;
    let [top, left, _, _] = a.pads;
    let bias = operands.get(2).map(|&v| cx.buf(v));
    let mut b = KernelBuilder::new(&format!(
        "conv_transpose2d_crop_{}_p{top}x{left}{}{}",
        dims_name(&[g.n, g.o, oh, ow]),
        if bias.is_some() { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" }
    ));
    let fa = b.arg("uncropped", cx.len_of(full), Access::Read);
    let mut args = vec![full];
    let ba = bias.map(|bb| {
        args.push(bb);
        b.arg("bias", cx.len_of(bb), Access::Read)
    });
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    b.set_parallel();
    b.for_loop(0, g.o as i64, 1, |b, oc| {
        let oc = Affine::var(oc);
        let shift = ba.map(|bb| {
            let v = b.let_(Expr::load(bb, oc.clone(), s1), s1);
            let v4 = b.let_(Expr::splat_to(v.clone(), w4), w4);
            (v, v4)
        });
        b.for_loop(0, g.n as i64, 1, |b, ni| {
            let ni = Affine::var(ni);
            let image = ni.scale(g.o as i64).add(&oc);
            b.for_loop(0, oh as i64, 1, |b, y| {
                let y = Affine::var(y);
                let src_row = image
                    .scale((fh * fw) as i64)
                    .add(&y.plus(top as i64).scale(fw as i64))
                    .plus(left as i64);
                let dst_row = image.scale((oh * ow) as i64).add(&y.scale(ow as i64));
                let emit = |b: &mut KernelBuilder, xq: Affine, wd: Width| {
                    let mut v = Expr::load(fa, src_row.add(&xq), wd);
                    if let Some((s, s4)) = &shift {
                        let k = if wd == w4 { s4 } else { s };
                        v = Expr::binary(BinOp::Add, v, k.clone());
                    }
                    let idx = [ni.clone(), oc.clone(), y.clone(), xq.clone()];
                    let v = epi.apply(b, v, &idx, wd);
                    b.store(ya, dst_row.add(&xq), v, wd);
                };
                let vec_end = (ow / 4 * 4) as i64;
                b.for_loop(0, vec_end, 4, |b, xq| emit(b, Affine::var(xq), w4));
                b.for_loop(vec_end, ow as i64, 1, |b, xq| emit(b, Affine::var(xq), s1));
            });
        });
    });
    cx.step(b.finish(), args)
}
