//! conv2d (and fused conv2d) → padding kernels and a register-blocked convolution kernel.
//!
//! Two direct forms (3×3 stride-1 convs may go to `winograd` first):
//!
//! - **Packed** (output channels per group a multiple of 4, constant weights): the input
//!   is copied into a zero-padded channels-last (NHWC) buffer, weights are packed at
//!   compile time so vectors run along output channels, and a tile is `V` channel vectors
//!   × `P` output pixels (broadcast input × weight vector FMAs). The outer loop order
//!   (channel blocks or row bands first) comes from a model of the bytes each moves from
//!   beyond L2. See [`PackedConv`].
//! - **General** (any channel count, weights from the graph): the input is copied into a
//!   zero-padded NCHW buffer whose rows are split by column phase (`column mod
//!   stride_w`), so the input columns feeding consecutive output columns are consecutive;
//!   tiles are `OT` output channels × `WV` vectors of 4 output columns (broadcast weight,
//!   vector input).
//!
//! Neither needs bounds tests; both apply bias and post-ops to the tile in registers and
//! store it once.

use smelt_ir::loops::{Access, Affine, Expr, KernelBuilder, LoopVar, VarId, Width};
use smelt_ir::op::Conv2dAttrs;
use smelt_ir::{AlignedBuf, Diagnostic, TensorType, Value};

use super::elementwise::{dims_name, Epilogue};
use super::{BufferId, Cx};

/// Most accumulators in one register tile (x86-64 has 16 vector registers; Cranelift's
/// FMA needs a spare one, and the shared operands need the rest).
const MAX_ACCUMULATORS: usize = 12;

/// The register tile for a row of `ow` output columns: (channels, vectors of 4 columns).
///
/// Cranelift emits each accumulator's FMA chain in turn, so an operand shared by several
/// accumulators stays in a register across their chains. Wide rows use one channel and up
/// to 12 vectors: the broadcast weight is the only shared operand and every input load has
/// one use, which folds into the FMA. Narrow rows add channels while
/// `channels·vectors + vectors ≤ 13` (accumulators plus shared inputs plus two spare).
fn tile_shape(ow: usize, og: usize) -> (usize, usize) {
    let vecs = (ow / 4).max(1);
    if vecs >= 6 {
        return (1, vecs.min(MAX_ACCUMULATORS));
    }
    let nt = ((MAX_ACCUMULATORS + 1 - vecs) / vecs).clamp(1, MAX_ACCUMULATORS / vecs);
    (nt.min(og.max(1)), vecs)
}

/// Shapes of one convolution, in elements.
#[derive(Clone)]
pub(super) struct Geo {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) o: usize,
    pub(super) cg: usize,
    pub(super) og: usize,
    pub(super) groups: usize,
    pub(super) kh: usize,
    pub(super) kw: usize,
    pub(super) oh: usize,
    pub(super) ow: usize,
    pub(super) stride: [usize; 2],
    pub(super) dil: [usize; 2],
    /// Rows of the (padded) input.
    pub(super) hp: usize,
    /// Column phases (= stride along W) and columns per phase of the (padded) input.
    pub(super) phases: usize,
    pub(super) wq: usize,
}

impl Geo {
    /// Element index in the padded, phase-split input.
    fn x_index(&self, n: &Affine, c: &Affine, row: &Affine, phase: usize, q: &Affine) -> Affine {
        let plane = (self.hp * self.phases * self.wq) as i64;
        n.scale(self.c as i64 * plane)
            .add(&c.scale(plane))
            .add(&row.scale((self.phases * self.wq) as i64))
            .add(&q.plus((phase * self.wq) as i64))
    }

    fn w_index(&self, o: &Affine, c: &Affine, kh: usize, kw: usize) -> Affine {
        o.scale((self.cg * self.kh * self.kw) as i64)
            .add(&c.scale((self.kh * self.kw) as i64))
            .plus((kh * self.kw + kw) as i64)
    }
}

pub(crate) fn lower_conv2d(
    cx: &mut Cx,
    a: &Conv2dAttrs,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if let Some(plan) = super::winograd::plan(cx, a, operands, out_ty) {
        return super::winograd::lower(cx, &plan, operands, epi, out);
    }
    let xt = cx.func.type_of(operands[0]).clone();
    let wt = cx.func.type_of(operands[1]).clone();
    let [n, c, h, w] = [xt.dims[0], xt.dims[1], xt.dims[2], xt.dims[3]];
    let [o, cg, kh, kw] = [wt.dims[0], wt.dims[1], wt.dims[2], wt.dims[3]];
    let [oh, ow] = [out_ty.dims[2], out_ty.dims[3]];
    let [pt, pl, pb, pr] = a.pads;
    let sw = a.strides[1];
    let hp = h + pt + pb;
    let wp = w + pl + pr;
    let geo = Geo {
        n,
        c,
        o,
        cg,
        og: o / a.groups,
        groups: a.groups,
        kh,
        kw,
        oh,
        ow,
        stride: a.strides,
        dil: a.dilations,
        hp,
        phases: sw,
        wq: wp.div_ceil(sw),
    };

    let x = cx.buf(operands[0]);
    let og = o / a.groups;
    if og.is_multiple_of(4) {
        if let Some(wdata) = cx.const_data(operands[1]) {
            let packed = PackedConv {
                channels_last: true,
                ..PackedConv::new(&geo, og)
            };
            let (pack, pack_geo) = (packed.clone(), geo.clone());
            let wbuf = cx.constant_later(
                "w_packed",
                o * cg * kh * kw,
                Box::new(move || pack.pack(&pack_geo, wdata)),
            );
            let wp1 = w + pl + pr;
            // The packed kernel reads channels-last (NHWC) input: the input channels of
            // one pixel are consecutive, so a tile's loads walk a few contiguous runs
            // instead of one page per channel.
            let len = n * hp * wp1 * c;
            let xp = cx.temp("padded_nhwc", len);
            let src_len = cx.len_of(x);
            if pt > 0 || pb > 0 {
                let k = nhwc_border_kernel(n, c, [h, hp, wp1], pt, len);
                cx.step(k, vec![xp])?;
            }
            let k = nhwc_pad_kernel(n, c, [h, w], [pt, pl], [hp, wp1], src_len, len);
            cx.step(k, vec![x, xp])?;
            let geo1 = Geo {
                phases: 1,
                wq: wp1,
                ..geo
            };
            return packed.kernel(cx, &geo1, xp, wbuf, operands, epi, out);
        }
    }
    let xp = if a.pads == [0; 4] && sw == 1 {
        x
    } else {
        let len = n * c * hp * sw * geo.wq;
        let xp = cx.temp("padded", len);
        let k = pad_kernel(
            n * c,
            [h, w],
            [pt, pl],
            sw,
            [hp, geo.wq],
            0.0,
            cx.len_of(x),
            len,
        );
        cx.step(k, vec![x, xp])?;
        xp
    };
    conv_kernel(cx, &geo, xp, operands, epi, out)
}

/// Writes the padded buffer (`planes` planes of `hp` rows × `sw` phases × `wq` columns):
/// each `h × w` input plane at row `pt`, column `pl`, with columns split by phase
/// (`column mod sw`), and `fill` everywhere else. Every element is written once: the
/// border rows and, per interior row and phase, the columns before and after the copied
/// run. Stride-2 phases are gathered from pairs of vectors by shuffles.
#[allow(clippy::too_many_arguments)]
pub(crate) fn pad_kernel(
    planes: usize,
    [h, w]: [usize; 2],
    [pt, pl]: [usize; 2],
    sw: usize,
    [hp, wq]: [usize; 2],
    fill: f32,
    src_len: usize,
    dst_len: usize,
) -> smelt_ir::loops::Kernel {
    let mut b = KernelBuilder::new(&format!(
        "pad_{planes}x{h}x{w}_t{pt}l{pl}_{hp}x{sw}x{wq}_fill{fill}"
    ));
    let src = b.arg("x", src_len, Access::Read);
    let dst = b.arg("padded", dst_len, Access::Write);
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    let row_len = (sw * wq) as i64;
    let plane = hp as i64 * row_len;
    // `fill` over `len` elements from `start` (an affine index)
    let fill_run = |b: &mut KernelBuilder, start: &Affine, len: i64| {
        let main = len / 4 * 4;
        b.for_loop(0, main, 4, |b, k| {
            b.store(
                dst,
                start.add(&Affine::var(k)),
                Expr::constant(fill, w4),
                w4,
            )
        });
        b.for_loop(main, len, 1, |b, k| {
            b.store(
                dst,
                start.add(&Affine::var(k)),
                Expr::constant(fill, s1),
                s1,
            )
        });
    };
    // one plane per trip, split across threads
    b.set_parallel();
    b.for_loop(0, planes as i64, 1, |b, p| {
        let plane_at = Affine::var(p).scale(plane);
        fill_run(b, &plane_at, pt as i64 * row_len);
        let bottom = (hp - pt - h) as i64 * row_len;
        fill_run(b, &plane_at.plus((pt + h) as i64 * row_len), bottom);
        b.for_loop(0, h as i64, 1, |b, r| {
            let src_row = Affine::var(p)
                .scale((h * w) as i64)
                .add(&Affine::var(r).scale(w as i64));
            let dst_row = plane_at.add(&Affine::var(r).plus(pt as i64).scale(row_len));
            for phase in 0..sw {
                // input columns x with (x + pl) mod sw == phase: x = x0 + k·sw
                let x0 = (phase + sw - pl % sw) % sw;
                let phase_at = dst_row.plus((phase * wq) as i64);
                let (count, q0) = if x0 < w {
                    ((w - x0).div_ceil(sw), (x0 + pl) / sw)
                } else {
                    (0, wq)
                };
                fill_run(b, &phase_at, q0.min(wq) as i64);
                let after = (q0 + count).min(wq);
                fill_run(b, &phase_at.plus(after as i64), (wq - after) as i64);
                if count == 0 {
                    continue;
                }
                let dst_at = |k: &Affine| phase_at.add(k).plus(q0 as i64);
                let src_at = |k: &Affine| src_row.add(&k.scale(sw as i64)).plus(x0 as i64);
                // vector blocks of 4 outputs: sw = 1 loads them; sw = 2 takes the even
                // lanes of the 8 inputs from x0 + 2k (the last one must be in the row)
                let vec_end = match sw {
                    1 => count / 4 * 4,
                    2 if w >= x0 + 8 => ((w - x0 - 8) / 8 + 1) * 4,
                    _ => 0,
                } as i64;
                b.for_loop(0, vec_end, 4, |b, k| {
                    let k = Affine::var(k);
                    let v = if sw == 1 {
                        Expr::load(src, src_at(&k), w4)
                    } else {
                        let lo = Expr::load(src, src_at(&k), w4);
                        let hi = Expr::load(src, src_at(&k).plus(4), w4);
                        Expr::shuffle(lo, hi, [0, 2, 4, 6])
                    };
                    b.store(dst, dst_at(&k), v, w4);
                });
                b.for_loop(vec_end, count as i64, 1, |b, k| {
                    let k = Affine::var(k);
                    let v = Expr::load(src, src_at(&k), s1);
                    b.store(dst, dst_at(&k), v, s1);
                });
            }
        });
    });
    b.finish()
}

/// Zeroes the padding rows (top `pt` and bottom rows) of a channels-last padded buffer
/// of `n` images × `hp` rows × `wp` columns × `c` channels.
fn nhwc_border_kernel(
    n: usize,
    c: usize,
    [h, hp, wp]: [usize; 3],
    pt: usize,
    dst_len: usize,
) -> smelt_ir::loops::Kernel {
    let mut b = KernelBuilder::new(&format!("pad_border_nhwc_{n}x{hp}x{wp}x{c}_t{pt}h{h}"));
    let dst = b.arg("padded", dst_len, Access::Write);
    let row = (wp * c) as i64;
    let image = hp as i64 * row;
    let zero4 = Expr::constant(0.0, Width::F32x4);
    let zero = Expr::constant(0.0, Width::Scalar);
    b.for_loop(0, n as i64, 1, |b, i| {
        for (first, count) in [(0, pt), (pt + h, hp - pt - h)] {
            let len = count as i64 * row;
            let at = |k: LoopVar| {
                Affine::var(i)
                    .scale(image)
                    .add(&Affine::var(k))
                    .plus(first as i64 * row)
            };
            let main = len / 4 * 4;
            b.for_loop(0, main, 4, |b, k| {
                b.store(dst, at(k), zero4.clone(), Width::F32x4)
            });
            b.for_loop(main, len, 1, |b, k| {
                b.store(dst, at(k), zero.clone(), Width::Scalar)
            });
        }
    });
    b.finish()
}

/// Copies NCHW input rows into a channels-last (NHWC) buffer padded by `pl` zero
/// columns on the left and up to `wp` on the right, at row offset `pt` (the border rows
/// are [`nhwc_border_kernel`]'s). Blocks of 4 channels × 4 columns are transposed in
/// registers; leftover channels and columns go one element at a time. Parallel over
/// input rows.
#[allow(clippy::too_many_arguments)]
fn nhwc_pad_kernel(
    n: usize,
    c: usize,
    [h, w]: [usize; 2],
    [pt, pl]: [usize; 2],
    [hp, wp]: [usize; 2],
    src_len: usize,
    dst_len: usize,
) -> smelt_ir::loops::Kernel {
    let mut b = KernelBuilder::new(&format!("pad_nhwc_{n}x{c}x{h}x{w}_t{pt}l{pl}_{hp}x{wp}"));
    let src = b.arg("x", src_len, Access::Read);
    let dst = b.arg("padded", dst_len, Access::Write);
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    let plane = (h * w) as i64;
    let ci = c as i64;
    b.set_parallel();
    b.for_loop(0, h as i64, 1, |b, r| {
        b.for_loop(0, n as i64, 1, |b, i| {
            let r = Affine::var(r);
            let src_at = |ch: &Affine, col: &Affine| {
                Affine::var(i)
                    .scale(ci * plane)
                    .add(&ch.scale(plane))
                    .add(&r.scale(w as i64))
                    .add(col)
            };
            let row_start = Affine::var(i)
                .scale(hp as i64)
                .add(&r.plus(pt as i64))
                .scale(wp as i64 * ci);
            let dst_at = |col: &Affine, ch: &Affine| row_start.add(&col.scale(ci)).add(ch);
            // the left and right padding columns
            for (first, count) in [(0, pl), (pl + w, wp - pl - w)] {
                let len = (count * c) as i64;
                let at = |k: LoopVar| row_start.add(&Affine::var(k)).plus(first as i64 * ci);
                let main = len / 4 * 4;
                b.for_loop(0, main, 4, |b, k| {
                    b.store(dst, at(k), Expr::constant(0.0, w4), w4)
                });
                b.for_loop(main, len, 1, |b, k| {
                    b.store(dst, at(k), Expr::constant(0.0, s1), s1)
                });
            }
            let (c4, w4end) = ((c / 4 * 4) as i64, (w / 4 * 4) as i64);
            // Blocks of 16 channels × 4 columns: the loads walk 16 channel rows along
            // their columns (streams a prefetcher follows), and each pixel gets one whole
            // cache line of 16 channels. (Columns outer with all channels inner made each
            // row a 4-byte walk across C planes; channels outer with 4-channel blocks
            // wrote 16 bytes per pixel at a C-float stride, into a few L1 sets.)
            let block = |b: &mut KernelBuilder, ch: &Affine, col: &Affine, chans: usize| {
                for sub in 0..chans / 4 {
                    let ch = ch.plus(4 * sub as i64);
                    let rows: Vec<Expr> = (0..4)
                        .map(|k| {
                            let v = Expr::load(src, src_at(&ch.plus(k), col), w4);
                            b.let_(v, w4)
                        })
                        .collect();
                    for (k, v) in transpose4(b, &rows).into_iter().enumerate() {
                        b.store(dst, dst_at(&col.plus(pl as i64 + k as i64), &ch), v, w4);
                    }
                }
            };
            let c16 = (c / 16 * 16) as i64;
            b.for_loop(0, c16, 16, |b, ch| {
                b.for_loop(0, w4end, 4, |b, col| {
                    block(b, &Affine::var(ch), &Affine::var(col), 16)
                });
            });
            b.for_loop(c16, c4, 4, |b, ch| {
                b.for_loop(0, w4end, 4, |b, col| {
                    block(b, &Affine::var(ch), &Affine::var(col), 4)
                });
            });
            // leftover columns (all channels), then leftover channels (the other columns)
            let copy = |b: &mut KernelBuilder, ch: &Affine, col: &Affine| {
                let v = Expr::load(src, src_at(ch, col), s1);
                b.store(dst, dst_at(&col.plus(pl as i64), ch), v, s1);
            };
            b.for_loop(w4end, w as i64, 1, |b, col| {
                b.for_loop(0, ci, 1, |b, ch| {
                    copy(b, &Affine::var(ch), &Affine::var(col))
                })
            });
            b.for_loop(c4, ci, 1, |b, ch| {
                b.for_loop(0, w4end, 1, |b, col| {
                    copy(b, &Affine::var(ch), &Affine::var(col))
                })
            });
        });
    });
    b.finish()
}

fn conv_kernel(
    cx: &mut Cx,
    g: &Geo,
    xp: BufferId,
    operands: &[Value],
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let has_bias = operands.len() > 2;
    let mut b = KernelBuilder::new(&format!(
        "conv2d_{}_k{}x{}_s{}x{}_d{}x{}_g{}{}{}",
        dims_name(&[g.n, g.c, g.hp, g.phases * g.wq]),
        g.kh,
        g.kw,
        g.stride[0],
        g.stride[1],
        g.dil[0],
        g.dil[1],
        g.groups,
        if has_bias { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" }
    ));
    let xa = b.arg("x", cx.len_of(xp), Access::Read);
    let wb = cx.buf(operands[1]);
    let wa = b.arg("w", cx.len_of(wb), Access::Read);
    let mut args = vec![xp, wb];
    let bias = if has_bias {
        let bb = cx.buf(operands[2]);
        args.push(bb);
        Some(b.arg("bias", cx.len_of(bb), Access::Read))
    } else {
        None
    };
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);

    let bufs = TileBufs {
        x: xa,
        w: wa,
        bias,
        out: ya,
        partial: None,
    };
    let (nt, nv) = tile_shape(g.ow, g.og);
    let og_main = g.og / nt * nt;
    // the outermost loop is split across threads: groups when there are several, else rows
    let rows = |b: &mut KernelBuilder, grp: Affine, r: Affine, n: Affine| {
        let at = |ob: Affine| TileAt {
            n: n.clone(),
            o0: grp.scale(g.og as i64).add(&ob),
            c0: grp.scale(g.cg as i64),
            oh: r.clone(),
        };
        b.for_loop(0, og_main as i64, nt as i64, |b, ob| {
            row_of_tiles(b, g, &bufs, &epi, &at(Affine::var(ob)), nt, nv);
        });
        if og_main < g.og {
            let rest = g.og - og_main;
            row_of_tiles(
                b,
                g,
                &bufs,
                &epi,
                &at(Affine::constant(og_main as i64)),
                rest,
                nv,
            );
        }
    };
    b.set_parallel();
    if g.groups > 1 {
        b.for_loop(0, g.groups as i64, 1, |b, grp| {
            b.for_loop(0, g.n as i64, 1, |b, n| {
                b.for_loop(0, g.oh as i64, 1, |b, r| {
                    rows(b, Affine::var(grp), Affine::var(r), Affine::var(n))
                });
            });
        });
    } else {
        b.for_loop(0, g.oh as i64, 1, |b, r| {
            b.for_loop(0, g.n as i64, 1, |b, n| {
                rows(b, Affine::constant(0), Affine::var(r), Affine::var(n))
            });
        });
    }
    cx.step(b.finish(), args)
}

struct TileBufs {
    x: smelt_ir::loops::BufId,
    w: smelt_ir::loops::BufId,
    bias: Option<smelt_ir::loops::BufId>,
    out: smelt_ir::loops::BufId,
    /// Partial sums between input-channel parts (`[n][o/4][oh][ow][4]`), when split.
    partial: Option<smelt_ir::loops::BufId>,
}

/// The input channels one pass over a tile covers, and how it starts and ends: the
/// first part starts from the bias, later ones from the partial sums; the last applies
/// the epilogue, earlier ones store partial sums.
struct ChannelPart {
    /// First input channel (within the group) of the part.
    c0: Affine,
    /// Input channels in the part.
    count: usize,
    first: bool,
    last: bool,
}

/// Where a tile row starts: batch, first output channel, first input channel of the
/// group, output row.
struct TileAt {
    n: Affine,
    o0: Affine,
    c0: Affine,
    oh: Affine,
}

/// One output row for `nt` channels: tiles of `nv` vectors, then one tile covering the
/// remaining columns whose last vector ends at the row's end — it may overlap the previous
/// tile, recomputing (and rewriting) identical values, so no scalar tail is needed. Rows
/// narrower than one vector use scalar lanes.
#[allow(clippy::too_many_arguments)]
fn row_of_tiles(
    b: &mut KernelBuilder,
    g: &Geo,
    bufs: &TileBufs,
    epi: &Epilogue,
    at: &TileAt,
    nt: usize,
    nv: usize,
) {
    if g.ow < 4 {
        let q0 = Affine::constant(0);
        tile(b, g, bufs, epi, at, nt, &q0, g.ow, Width::Scalar);
        return;
    }
    let span = 4 * nv;
    let main = g.ow / span * span;
    b.for_loop(0, main as i64, span as i64, |b, q| {
        tile(b, g, bufs, epi, at, nt, &Affine::var(q), nv, Width::F32x4);
    });
    if main < g.ow {
        let rest = (g.ow - main).div_ceil(4);
        let q0 = Affine::constant((g.ow - 4 * rest) as i64);
        tile(b, g, bufs, epi, at, nt, &q0, rest, Width::F32x4);
    }
}

/// A register tile: `nt` output channels × `nv` groups of `w.lanes()` output columns
/// starting at column `q0`.
#[allow(clippy::too_many_arguments)]
fn tile(
    b: &mut KernelBuilder,
    g: &Geo,
    bufs: &TileBufs,
    epi: &Epilogue,
    at: &TileAt,
    nt: usize,
    q0: &Affine,
    nv: usize,
    w: Width,
) {
    let lanes = w.lanes() as i64;
    let accs: Vec<Vec<VarId>> = (0..nt)
        .map(|_| (0..nv).map(|_| b.var(w)).collect())
        .collect();
    for (t, row) in accs.iter().enumerate() {
        let init = match bufs.bias {
            Some(bias) => Expr::splat_to(Expr::load(bias, at.o0.plus(t as i64), Width::Scalar), w),
            None => Expr::constant(0.0, w),
        };
        for &acc in row {
            b.assign(acc, init.clone());
        }
    }
    // One loop over input channels per tap: each body is one FMA per accumulator, so
    // the chains interleave and only the tap's shared operands are live.
    for kh in 0..g.kh {
        let row = at.oh.scale(g.stride[0] as i64).plus((kh * g.dil[0]) as i64);
        for kw in 0..g.kw {
            let col = kw * g.dil[1];
            let (phase, shift) = (col % g.phases, col / g.phases);
            b.for_loop(0, g.cg as i64, 1, |b, c| {
                let c = Affine::var(c);
                let cin = at.c0.add(&c);
                let xs: Vec<Expr> = (0..nv)
                    .map(|j| {
                        let q = q0.plus(j as i64 * lanes + shift as i64);
                        let idx = g.x_index(&at.n, &cin, &row, phase, &q);
                        let load = Expr::load(bufs.x, idx, w);
                        if nt > 1 {
                            b.let_(load, w)
                        } else {
                            load
                        }
                    })
                    .collect();
                for (t, row_accs) in accs.iter().enumerate() {
                    let wi = g.w_index(&at.o0.plus(t as i64), &c, kh, kw);
                    let wv = Expr::splat_to(Expr::load(bufs.w, wi, Width::Scalar), w);
                    let wv = if nv > 1 { b.let_(wv, w) } else { wv };
                    for (j, &acc) in row_accs.iter().enumerate() {
                        b.assign(acc, Expr::fma(xs[j].clone(), wv.clone(), Expr::Var(acc)));
                    }
                }
            });
        }
    }
    let out_plane = (g.oh * g.ow) as i64;
    for (t, row_accs) in accs.iter().enumerate() {
        for (j, &acc) in row_accs.iter().enumerate() {
            let o = at.o0.plus(t as i64);
            let col = q0.plus(j as i64 * lanes);
            let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
            let v = epi.apply(b, Expr::Var(acc), &idx, w);
            let dst =
                at.n.scale(g.o as i64 * out_plane)
                    .add(&o.scale(out_plane))
                    .add(&at.oh.scale(g.ow as i64))
                    .add(&col);
            b.store(bufs.out, dst, v, w);
        }
    }
}

/// Bytes of L2 cache per core (AMD Zen 3: 512 KiB) the conv loop order plans for,
/// leaving room for the output, the post-op operands and the stack.
const L2_BUDGET: usize = 384 << 10;

/// The outer loops of a packed convolution.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoopOrder {
    /// For each channel block, every output row: the whole input is swept once per
    /// block, so it should stay in L2 between blocks.
    BlocksOuter,
    /// For each band of `rows` output rows, every channel block: the band's input rows
    /// stay in L2 while all the weights stream past once per band.
    RowBands { rows: usize },
}

/// Chooses the loop order that moves the fewest bytes from beyond L2: the input once per
/// channel block when it does not fit, or the weights once per row band.
fn loop_order(g: &Geo, lanes: usize) -> LoopOrder {
    let f = std::mem::size_of::<f32>();
    let row_bytes = g.n * g.c * g.wq * f;
    let input = row_bytes * g.hp;
    let weights = g.o * g.cg * g.kh * g.kw * f;
    let block_w = g.cg * g.kh * g.kw * lanes * f;
    let blocks = g.o / lanes;
    let blocks_outer = if input + block_w <= L2_BUDGET {
        input + weights
    } else {
        blocks * input + weights
    };
    let mut best = (blocks_outer, LoopOrder::BlocksOuter);
    for band in (1..=g.oh).filter(|r| g.oh.is_multiple_of(*r)) {
        let band_input = ((band - 1) * g.stride[0] + (g.kh - 1) * g.dil[0] + 1) * row_bytes;
        if band_input + block_w > L2_BUDGET {
            break;
        }
        let bands = g.oh / band;
        let moved = if band_input + weights <= L2_BUDGET {
            input + weights
        } else {
            input + bands * weights
        };
        // fewer bytes; on a tie, the longer band (fewer re-reads of each weight block
        // from L2) as long as there are two bands to share between threads
        if moved < best.0 || (moved == best.0 && bands >= 2) {
            best = (moved, LoopOrder::RowBands { rows: band });
        }
    }
    best.1
}

/// A convolution with weights packed at compile time so that vectors run along output
/// channels: `[group][channel block][kh][kw][input channel][4·V lanes]`, each block
/// holding `4·V` consecutive output channels of its group.
///
/// A register tile is `V` vectors of output channels × `P` consecutive output pixels of
/// one row: per input channel and tap, `V` weight vectors are loaded, each input pixel is
/// loaded once and broadcast, and every accumulator gets one FMA. Strides and dilations
/// only change the input addresses, so the input needs no phase split. At the end, each
/// group of 4 pixels' accumulators is transposed into vectors of one channel × 4 columns
/// for the epilogue and vector stores along W; leftover pixels go lane by lane.
#[derive(Clone)]
pub(super) struct PackedConv {
    /// Vectors of 4 output channels per tile.
    pub(super) vecs: usize,
    /// Output pixels per tile (along a row).
    pub(super) pixels: usize,
    /// Channel blocks per group.
    pub(super) blocks: usize,
    /// Input channels per trip of the innermost loop.
    pub(super) unroll: usize,
    /// The input is channels-last (`[n][row][column][channel]`) rather than NCHW.
    pub(super) channels_last: bool,
}

impl PackedConv {
    /// The tile for a group of `og` output channels (a multiple of 4).
    pub(super) fn new(g: &Geo, og: usize) -> PackedConv {
        // accumulators (V·P) + weight vectors (V) + one broadcast + one spare ≤ 16 registers
        // Candidate tiles (vectors, most pixels): accumulators V·P ≤ 12 with the V weight
        // vectors, the broadcast and its copy in the 16 registers. FMA latency (4 cycles,
        // 2 pipes) needs ≥ 8 independent accumulators for full throughput; a tile with
        // fewer runs at the fraction it fills. Pick the tile of least modelled time per
        // row.
        let candidates: &[(usize, usize)] = if og.is_multiple_of(8) {
            &[(2, 4), (1, 12)]
        } else {
            &[(1, 12)]
        };
        let row_cost = |vecs: usize, max_pixels: usize| -> (u64, usize, usize) {
            let pixels = (1..=max_pixels.min(g.ow.max(1)))
                .rev()
                .min_by_key(|&p| g.ow.div_ceil(p))
                .unwrap_or(1);
            let full = g.ow / pixels;
            let rest = g.ow % pixels;
            // time per output channel, in 1/1000 cycles of FMA issue
            let tile = |p: usize| -> u64 {
                let fill = ((vecs * p) as f64 / 8.0).min(1.0);
                (1000.0 * p as f64 / fill) as u64
            };
            let mut cost = full as u64 * tile(pixels);
            if rest > 0 {
                cost += tile(rest);
            }
            // Two vectors share each broadcast, so it cannot fold into a memory operand
            // and needs a copy per FMA pair: measured in the disassembly, 3.4
            // instructions per FMA against 2.9 for one vector (the front end, 6
            // macro-ops per cycle, is the limit at 2 FMAs per cycle).
            if vecs == 2 {
                cost += cost * 15 / 100;
            }
            (cost, vecs, pixels)
        };
        let (_, vecs, pixels) = candidates
            .iter()
            .map(|&(v, p)| row_cost(v, p))
            .min_by_key(|&(cost, v, _)| (cost, v))
            .unwrap_or((0, 1, 1));
        PackedConv {
            vecs,
            pixels,
            blocks: og / (4 * vecs),
            unroll: 2,
            channels_last: false,
        }
    }

    pub(super) fn lanes(&self) -> usize {
        4 * self.vecs
    }

    /// Input channels per part when a tile's K loop should be split (`None`: one part).
    /// A tile reads its channel block's packed weights and, per kernel row, a run of
    /// input pixels; when that exceeds what L1 keeps across tiles, each pass over the
    /// rows covers only `kc` input channels, with partial sums stored in between (a few
    /// loads and stores per accumulator against `kc·kh·kw` FMAs). Channels-last, a part
    /// is a contiguous run of each pixel's channels; NCHW, it is `kc` channel rows of
    /// which a tile reads about one cache line per kernel row. With few pixels per row
    /// (Winograd's products at 14² and 7²: a 12-pixel and a 4-pixel tile) this is what
    /// keeps the second tile from streaming the weights from L3 again.
    fn channel_split(&self, g: &Geo) -> Option<usize> {
        const L1_BUDGET: usize = 28 << 10;
        let f = std::mem::size_of::<f32>();
        let span = (self.pixels - 1) * g.stride[1] + (g.kw - 1) * g.dil[1] + 1;
        let per_channel_input = if self.channels_last {
            g.kh * span * f
        } else {
            g.kh * (span * f).next_multiple_of(64)
        };
        let bytes = |kc: usize| kc * (g.kh * g.kw * self.lanes() * f + per_channel_input);
        if bytes(g.cg) <= L1_BUDGET {
            return None;
        }
        // the largest part that fits, in whole cache lines of each pixel's channels
        (32..g.cg)
            .rev()
            .filter(|kc| kc.is_multiple_of(16) && g.cg.is_multiple_of(*kc))
            .find(|&kc| bytes(kc) <= L1_BUDGET)
    }

    /// Packs OIHW weights into the blocked form.
    pub(super) fn pack(&self, g: &Geo, w: &[f32]) -> AlignedBuf {
        let lanes = self.lanes();
        let taps = g.kh * g.kw;
        let filter = g.cg * taps;
        AlignedBuf::from_f32_with(g.o * filter, |out| {
            // one output channel (a whole OIHW filter, read in order) at a time, written
            // `lanes` apart: [group][block][kh][kw][c][lane]
            for o in 0..g.o {
                let (grp, in_grp) = (o / g.og, o % g.og);
                let (blk, lane) = (in_grp / lanes, in_grp % lanes);
                let base = (grp * self.blocks + blk) * filter * lanes + lane;
                let src = w.get(o * filter..(o + 1) * filter).unwrap_or(&[]);
                for (c, taps_of_c) in src.chunks_exact(taps).enumerate() {
                    for (tap, &v) in taps_of_c.iter().enumerate() {
                        out[base + (tap * g.cg + c) * lanes] = v;
                    }
                }
            }
        })
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn kernel(
        &self,
        cx: &mut Cx,
        g: &Geo,
        xp: BufferId,
        wbuf: BufferId,
        operands: &[Value],
        mut epi: Epilogue,
        out: BufferId,
    ) -> Result<(), Diagnostic> {
        let has_bias = operands.len() > 2;
        let mut b = KernelBuilder::new(&format!(
            "conv2d_packed_{}_k{}x{}_s{}x{}_d{}x{}_g{}_o{}x{}p{}{}{}",
            dims_name(&[g.n, g.c, g.hp, g.wq]),
            g.kh,
            g.kw,
            g.stride[0],
            g.stride[1],
            g.dil[0],
            g.dil[1],
            g.groups,
            g.o,
            self.lanes(),
            self.pixels,
            if has_bias { "_bias" } else { "" },
            if epi.is_empty() { "" } else { "_fused" }
        ));
        let xa = b.arg("x", cx.len_of(xp), Access::Read);
        let wa = b.arg("w_packed", cx.len_of(wbuf), Access::Read);
        let mut args = vec![xp, wbuf];
        let bias = if has_bias {
            let bb = cx.buf(operands[2]);
            args.push(bb);
            Some(b.arg("bias", cx.len_of(bb), Access::Read))
        } else {
            None
        };
        args.extend(epi.declare(&mut b));
        let ya = b.arg("out", cx.len_of(out), Access::Write);
        args.push(out);
        let split = self.channel_split(g);
        let partial = match split {
            Some(_) => {
                let len = g.n * g.o * g.oh * g.ow;
                let pb = cx.temp("partial", len);
                args.push(pb);
                Some(b.arg("partial", len, Access::Write))
            }
            None => None,
        };
        let bufs = TileBufs {
            x: xa,
            w: wa,
            bias,
            out: ya,
            partial,
        };
        b.set_parallel();
        // Output rows `row0 + 0..count` of image `n` for one channel block: with the input
        // channels split, all rows for one part, then all rows for the next (so the
        // part's weights and input rows stay in L1 across tiles).
        let rows = |b: &mut KernelBuilder,
                    n: Affine,
                    grp: &Affine,
                    blk: &Affine,
                    row0: Affine,
                    count: usize| {
            let each_row = |b: &mut KernelBuilder, part: &ChannelPart| {
                b.for_loop(0, count as i64, 1, |b, r| {
                    let at = TileAt {
                        n: n.clone(),
                        o0: grp.scale(g.og as i64).add(&blk.scale(self.lanes() as i64)),
                        c0: grp.scale(g.cg as i64),
                        oh: row0.add(&Affine::var(r)),
                    };
                    let block_index = grp.scale(self.blocks as i64).add(blk);
                    let p = self.pixels;
                    let main = g.ow / p * p;
                    b.for_loop(0, main as i64, p as i64, |b, q| {
                        let q = Affine::var(q);
                        self.tile(b, g, &bufs, &epi, &at, &block_index, &q, p, part);
                    });
                    if main < g.ow {
                        let q0 = Affine::constant(main as i64);
                        let rest = g.ow - main;
                        self.tile(b, g, &bufs, &epi, &at, &block_index, &q0, rest, part);
                    }
                });
            };
            match split {
                None => {
                    let whole = ChannelPart {
                        c0: Affine::constant(0),
                        count: g.cg,
                        first: true,
                        last: true,
                    };
                    each_row(b, &whole);
                }
                Some(kc) => {
                    let parts = g.cg / kc;
                    let part = |c0: Affine, first: bool, last: bool| ChannelPart {
                        c0,
                        count: kc,
                        first,
                        last,
                    };
                    each_row(b, &part(Affine::constant(0), true, false));
                    b.for_loop(1, parts as i64 - 1, 1, |b, k| {
                        each_row(b, &part(Affine::var(k).scale(kc as i64), false, false))
                    });
                    let last = Affine::constant(((parts - 1) * kc) as i64);
                    each_row(b, &part(last, false, true));
                }
            }
        };
        let all_rows = |b: &mut KernelBuilder, grp: &Affine, blk: &Affine| {
            b.for_loop(0, g.n as i64, 1, |b, n| {
                rows(b, Affine::var(n), grp, blk, Affine::constant(0), g.oh)
            });
        };
        let grp0 = Affine::constant(0);
        match loop_order(g, self.lanes()) {
            LoopOrder::BlocksOuter if g.groups == 1 => {
                b.for_loop(0, self.blocks as i64, 1, |b, blk| {
                    all_rows(b, &grp0, &Affine::var(blk))
                });
            }
            LoopOrder::BlocksOuter => {
                b.for_loop(0, g.groups as i64, 1, |b, grp| {
                    b.for_loop(0, self.blocks as i64, 1, |b, blk| {
                        all_rows(b, &Affine::var(grp), &Affine::var(blk))
                    });
                });
            }
            LoopOrder::RowBands { rows: band } => {
                b.for_loop(0, (g.oh / band) as i64, 1, |b, bi| {
                    let row0 = Affine::var(bi).scale(band as i64);
                    b.for_loop(0, g.groups as i64, 1, |b, grp| {
                        b.for_loop(0, self.blocks as i64, 1, |b, blk| {
                            b.for_loop(0, g.n as i64, 1, |b, n| {
                                let (grp, blk) = (Affine::var(grp), Affine::var(blk));
                                rows(b, Affine::var(n), &grp, &blk, row0.clone(), band)
                            });
                        });
                    });
                });
            }
        }
        cx.step(b.finish(), args)
    }

    /// One tile: `V` channel vectors × `pixels` output pixels from column `q0`.
    #[allow(clippy::too_many_arguments)]
    fn tile(
        &self,
        b: &mut KernelBuilder,
        g: &Geo,
        bufs: &TileBufs,
        epi: &Epilogue,
        at: &TileAt,
        block_index: &Affine,
        q0: &Affine,
        pixels: usize,
        part: &ChannelPart,
    ) {
        let w4 = Width::F32x4;
        let lanes = self.lanes() as i64;
        let accs: Vec<Vec<VarId>> = (0..self.vecs)
            .map(|_| (0..pixels).map(|_| b.var(w4)).collect())
            .collect();
        // partial sums: [n][o/4][oh][ow][4], so a tile's accumulators are consecutive
        let out_plane = (g.oh * g.ow) as i64;
        let partial_index = |v: usize, p: usize| {
            at.n.scale(g.o as i64 * out_plane)
                .add(&at.o0.plus(4 * v as i64).scale(out_plane))
                .add(&at.oh.scale(4 * g.ow as i64))
                .add(&q0.plus(p as i64).scale(4))
        };
        if let (false, Some(pbuf)) = (part.first, bufs.partial) {
            for (v, row) in accs.iter().enumerate() {
                for (p, &acc) in row.iter().enumerate() {
                    b.assign(acc, Expr::load(pbuf, partial_index(v, p), w4));
                }
            }
        }
        for (v, row) in accs.iter().enumerate() {
            if !part.first {
                break;
            }
            let init = match bufs.bias {
                Some(bias) => Expr::load(bias, at.o0.plus(4 * v as i64), w4),
                None => Expr::constant(0.0, w4),
            };
            let init = if pixels > 1 && !init.is_trivial() {
                b.let_(init, w4)
            } else {
                init
            };
            for &acc in row {
                b.assign(acc, init.clone());
            }
        }
        let block_len = (g.kh * g.kw * g.cg) as i64 * lanes;
        // One FMA per accumulator for input channel `c` at tap (kh, kw).
        let step = |b: &mut KernelBuilder, kh: &Affine, kw: &Affine, c: &Affine| {
            let tap = kh.scale(g.kw as i64).add(kw);
            let wbase = block_index
                .scale(block_len)
                .add(&c.scale(lanes))
                .add(&tap.scale(g.cg as i64 * lanes));
            let ws: Vec<Expr> = (0..self.vecs)
                .map(|v| {
                    let load = Expr::load(bufs.w, wbase.plus(4 * v as i64), w4);
                    if pixels > 1 {
                        b.let_(load, w4)
                    } else {
                        load
                    }
                })
                .collect();
            let row = at
                .oh
                .scale(g.stride[0] as i64)
                .add(&kh.scale(g.dil[0] as i64));
            // the input of pixel p is at xbase + p·pixel_step
            let (xbase, pixel_step) = if self.channels_last {
                let ci = g.c as i64;
                let base =
                    at.n.scale(g.hp as i64 * g.wq as i64 * ci)
                        .add(&row.scale(g.wq as i64 * ci))
                        .add(&q0.scale(g.stride[1] as i64 * ci))
                        .add(&kw.scale(g.dil[1] as i64 * ci))
                        .add(&at.c0.add(c));
                (base, g.stride[1] as i64 * ci)
            } else {
                let plane = (g.hp * g.wq) as i64;
                let base =
                    at.n.scale(g.c as i64 * plane)
                        .add(&at.c0.add(c).scale(plane))
                        .add(&row.scale(g.wq as i64))
                        .add(&q0.scale(g.stride[1] as i64))
                        .add(&kw.scale(g.dil[1] as i64));
                (base, g.stride[1] as i64)
            };
            for p in 0..pixels {
                let xi = xbase.plus(p as i64 * pixel_step);
                let xv = Expr::Splat(Box::new(Expr::load(bufs.x, xi, Width::Scalar)));
                let xv = if self.vecs > 1 { b.let_(xv, w4) } else { xv };
                // the broadcast first: x86 FMAs overwrite their first factor, and the
                // broadcast is the operand that dies
                for (v, row_accs) in accs.iter().enumerate() {
                    let acc = row_accs[p];
                    b.assign(acc, Expr::fma(xv.clone(), ws[v].clone(), Expr::Var(acc)));
                }
            }
        };
        // Channels-last input with unit column dilation: the taps of one kernel row
        // read kw·cg consecutive input floats against kw·cg consecutive packed weight
        // vectors, so (kw, channel) runs as one loop over `chans` (the stem's 7×3
        // becomes one loop of 21).
        let whole = part.count == g.cg;
        let flat = self.channels_last && g.dil[1] == 1 && g.groups == 1 && whole;
        let (taps_w, chans) = if flat {
            (1, g.kw * g.cg)
        } else {
            (g.kw, part.count)
        };
        let step = |b: &mut KernelBuilder, kh: &Affine, kw: &Affine, c: &Affine| {
            step(b, kh, kw, &c.add(&part.c0))
        };
        let unroll = self.unroll.min(chans).max(1);
        if chans / unroll >= 2 || g.kh == 1 {
            // a loop over input channels per tap, `unroll` channels per trip
            let main = chans / unroll * unroll;
            for kh in 0..g.kh {
                let kh = Affine::constant(kh as i64);
                for kw in 0..taps_w {
                    let kw = Affine::constant(kw as i64);
                    b.for_loop(0, main as i64, unroll as i64, |b, c| {
                        for u in 0..unroll {
                            step(b, &kh, &kw, &Affine::var(c).plus(u as i64));
                        }
                    });
                    b.for_loop(main as i64, chans as i64, 1, |b, c| {
                        step(b, &kh, &kw, &Affine::var(c))
                    });
                }
            }
        } else {
            // Few input channels (a network's stem): loops over kernel rows and columns,
            // so each loop body holds at most two weight vectors. Straight-line taps
            // would make the weight loads invariant in the row loops or, in one body,
            // keep every tap's weights live at once; either way Cranelift spills them.
            b.for_loop(0, g.kh as i64, 1, |b, kh| {
                b.for_loop(0, g.kw as i64, 1, |b, kw| {
                    let (kh, kw) = (Affine::var(kh), Affine::var(kw));
                    if g.cg <= 2 {
                        for c in 0..g.cg {
                            step(b, &kh, &kw, &Affine::constant(c as i64));
                        }
                    } else {
                        b.for_loop(0, g.cg as i64, 1, |b, c| step(b, &kh, &kw, &Affine::var(c)));
                    }
                });
            });
        }
        if !part.last {
            if let Some(pbuf) = bufs.partial {
                for (v, row) in accs.iter().enumerate() {
                    for (p, &acc) in row.iter().enumerate() {
                        b.store(pbuf, partial_index(v, p), Expr::Var(acc), w4);
                    }
                }
            }
            return;
        }
        let out_index = |o: &Affine, col: &Affine| {
            at.n.scale(g.o as i64 * out_plane)
                .add(&o.scale(out_plane))
                .add(&at.oh.scale(g.ow as i64))
                .add(col)
        };
        for (v, row_accs) in accs.iter().enumerate() {
            // Groups of 4 pixels: a 4×4 transpose turns 4 accumulators (4 channels each)
            // into 4 vectors of one channel × 4 consecutive columns, so the post-ops run
            // on f32x4 and the stores are vector stores along W.
            let quads = row_accs.len() / 4;
            for quad in 0..quads {
                let tile: Vec<Expr> = row_accs[4 * quad..4 * quad + 4]
                    .iter()
                    .map(|&acc| Expr::Var(acc))
                    .collect();
                let col = q0.plus(4 * quad as i64);
                for (l, channel) in transpose4(b, &tile).into_iter().enumerate() {
                    let o = at.o0.plus(4 * v as i64 + l as i64);
                    let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                    let val = epi.apply(b, channel, &idx, w4);
                    b.store(bufs.out, out_index(&o, &col), val, w4);
                }
            }
            // the tail pixels, one lane at a time
            for l in 0..4 {
                let o = at.o0.plus(4 * v as i64 + l);
                for (p, &acc) in row_accs.iter().enumerate().skip(4 * quads) {
                    let col = q0.plus(p as i64);
                    let s = Expr::lane(Expr::Var(acc), l as u8);
                    let idx = [at.n.clone(), o.clone(), at.oh.clone(), col.clone()];
                    let val = epi.apply(b, s, &idx, Width::Scalar);
                    b.store(bufs.out, out_index(&o, &col), val, Width::Scalar);
                }
            }
        }
    }
}

/// Transposes a 4×4 tile held in four vectors: lane `j` of result `i` is lane `i` of
/// input `j`. Eight two-input shuffles (unpack low/high of lanes, then of lane pairs),
/// each bound to a variable so no shuffle is emitted twice.
pub(super) fn transpose4(b: &mut KernelBuilder, rows: &[Expr]) -> Vec<Expr> {
    let w4 = Width::F32x4;
    let shuf = |b: &mut KernelBuilder, x: &Expr, y: &Expr, m: [u8; 4]| {
        b.let_(Expr::shuffle(x.clone(), y.clone(), m), w4)
    };
    // [r0.0, r1.0, r0.1, r1.1], [r2.0, r3.0, r2.1, r3.1], and the same for lanes 2, 3
    let lo01 = shuf(b, &rows[0], &rows[1], [0, 4, 1, 5]);
    let lo23 = shuf(b, &rows[2], &rows[3], [0, 4, 1, 5]);
    let hi01 = shuf(b, &rows[0], &rows[1], [2, 6, 3, 7]);
    let hi23 = shuf(b, &rows[2], &rows[3], [2, 6, 3, 7]);
    vec![
        shuf(b, &lo01, &lo23, [0, 1, 4, 5]),
        shuf(b, &lo01, &lo23, [2, 3, 6, 7]),
        shuf(b, &hi01, &hi23, [0, 1, 4, 5]),
        shuf(b, &hi01, &hi23, [2, 3, 6, 7]),
    ]
}
