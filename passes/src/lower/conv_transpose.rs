//! Lowering of `conv_transpose2d`: one product on micro-kernel tiles when the kernel
//! equals the stride, else a gather by output phase.
//!
//! Kernel = stride (2×2 stride 2, the upsampling heads of U-Nets and DBNet): no two taps
//! land on one output pixel, so the op is a product — each input pixel's channels times a
//! `[C][O·KH·KW]` matrix give its `KH×KW` patch of every output channel — computed like a
//! 1×1 convolution by the conv-tile routines, its taps scattered to their patches by the
//! epilogue ([`lower_as_product`]).
//!
//! The gather by output phase (every other case): each output pixel sums,
//! over the taps whose stride grid lands on it, `x · w` across its group's input
//! channels, in registers, and is stored once — no read-modify-write of the output.
//!
//! Why phases: output row `y` (row `yf = y + pad_top` of the uncropped result) takes tap
//! `ky` exactly when `yf − ky·dh` is a multiple of the stride, from input row
//! `(yf − ky·dh) / sh`. Writing `yf = sh·q + r`, the taps that land are fixed per residue
//! `r` (a phase) and their input row is `q + t` for a per-tap constant `t` — affine in `q`.
//! Each phase's `q` range is split where a tap's input row enters or leaves the image, so
//! every piece has one tap set and constant loop bounds: all addresses are affine, no
//! guards or run-time indices, and `Kernel::check` proves every access. Rows and columns
//! no tap reaches (output padding, strides past the kernel) get the bias alone.
//!
//! Vectors: the weights are first repacked to `[group][ky][kx][c][o]` (a small copy
//! kernel, since they may be computed at run time), so 4 consecutive output channels of
//! one tap and input channel are one vector load; a tile of up to 4 such vectors (16
//! channels) shares each input value's broadcast. The accumulated lanes are stored one by
//! one, as output channels are a plane apart. Output channels past the last whole vector
//! run as scalars in a second kernel. Parallel over channel vectors (or groups). As a
//! fusion anchor, its post-ops (a BN turned affine, a bias, an activation) apply to each
//! element just before its one store.

use smelt_ir::loops::{
    Access, Affine, BinOp, BufId, BufPtr, ConvTile, Expr, KernelBuilder, LoopVar, TileRoutine,
    Width,
};
use smelt_ir::op::ConvTranspose2dAttrs;
use smelt_ir::{AlignedBuf, ConstantSlab};
use smelt_ir::{Diagnostic, Layout, TensorType, Value};

use super::elementwise::{dims_name, Epilogue};
use super::{BufferId, Cx};

/// Input channels per step of the reduction loop, when they divide evenly.
const UNROLL: usize = 4;

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
    /// The result's rows and columns.
    out: [usize; 2],
}

/// A run of `q` (see the module doc) over which the same taps land.
struct Piece {
    /// First `q`.
    start: i64,
    /// Exclusive end.
    end: i64,
    /// The taps that land: kernel index and input offset `t` (input position `q + t`).
    taps: Vec<(i64, i64)>,
}

/// One residue of the uncropped coordinate modulo the stride, along one axis.
struct Phase {
    /// Output coordinate of `q = 0`: `r − pad_begin` (possibly negative).
    origin: i64,
    pieces: Vec<Piece>,
}

/// The phases along one axis: `out_len` outputs after `pad` cropped ones, `input`
/// positions, `k` taps `dil` apart, stride `s`.
fn phases(out_len: usize, pad: usize, s: usize, dil: usize, k: usize, input: usize) -> Vec<Phase> {
    let (out_len, pad, s, dil, input) = (
        out_len as i64,
        pad as i64,
        s as i64,
        dil as i64,
        input as i64,
    );
    let mut result = Vec::new();
    for r in 0..s {
        // pad <= s*q + r < pad + out_len
        let q_lo = (pad - r + s - 1).div_euclid(s);
        let q_hi = (pad + out_len - r + s - 1).div_euclid(s);
        if q_lo >= q_hi {
            continue;
        }
        let taps: Vec<(i64, i64)> = (0..k as i64)
            .filter(|&kk| (r - kk * dil).rem_euclid(s) == 0)
            .map(|kk| (kk, (r - kk * dil).div_euclid(s)))
            .collect();
        let mut cuts = vec![q_lo, q_hi];
        for &(_, t) in &taps {
            cuts.extend([-t, input - t].map(|c| c.clamp(q_lo, q_hi)));
        }
        cuts.sort_unstable();
        cuts.dedup();
        let pieces = cuts
            .windows(2)
            .map(|w| Piece {
                start: w[0],
                end: w[1],
                // constant over the piece: check its first q
                taps: taps
                    .iter()
                    .copied()
                    .filter(|&(_, t)| (0..input).contains(&(w[0] + t)))
                    .collect(),
            })
            .collect();
        result.push(Phase {
            origin: r - pad,
            pieces,
        });
    }
    result
}

/// `conv_transpose2d(x, w, bias?)`; post-ops never reach it (it is no fusion anchor).
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
    let g = Geometry {
        n,
        c,
        h,
        w,
        o: out_ty.dims[1],
        og: wt.dims[1],
        cg: c / a.groups,
        groups: a.groups,
        kh: wt.dims[2],
        kw: wt.dims[3],
        out: [out_ty.dims[2], out_ty.dims[3]],
    };
    if let Some(routine) = product_routine(cx, a, &g, operands) {
        return lower_as_product(cx, &g, routine, operands, epi, out);
    }
    let packed = pack_weights(cx, &g, cx.buf(operands[1]))?;
    let whole = g.og / 4 * 4;
    if whole > 0 {
        gather(cx, a, &g, operands, packed, 4, 0..whole, epi.clone(), out)?;
    }
    if whole < g.og {
        gather(cx, a, &g, operands, packed, 1, whole..g.og, epi, out)?;
    }
    Ok(())
}

/// The micro-kernel routine for a transposed convolution whose kernel equals its stride
/// (2×2 stride 2, the upsampling heads of U-Nets and DBNet), if it has one: no padding,
/// dilation, output padding or groups, constant weights, a micro-kernel target, and
/// taps per channel dividing the routine's lanes. Then no
/// two taps land on the same output pixel, and the whole op is one product — each input
/// pixel's `C` channels times a `[C][O·KH·KW]` matrix gives its `KH×KW` patch of every
/// output channel — whose tiles the micro-kernel computes like a 1×1 convolution's.
fn product_routine(
    cx: &Cx,
    a: &ConvTranspose2dAttrs,
    g: &Geometry,
    operands: &[Value],
) -> Option<TileRoutine> {
    let non_overlapping = a.strides == [g.kh, g.kw]
        && a.pads == [0; 4]
        && a.dilations == [1, 1]
        && a.output_padding == [0, 0]
        && g.groups == 1
        && g.out == [g.h * g.kh, g.w * g.kw];
    if !non_overlapping || cx.const_weight(operands[1]).is_none() {
        return None;
    }
    // the routine that pads the product's columns least, the wider on a tie (a
    // 1-channel head's 4 columns fill a quarter of 16 lanes: still as many useful lanes
    // as f32x4, with no gather of taps)
    let columns = g.o * g.kh * g.kw;
    // (a block's columns must start at a channel's first tap: taps divide the lanes)
    let taps = g.kh * g.kw;
    cx.opts
        .micro?
        .routines()
        .filter(|r| r.lanes > 0 && (r.lanes as usize).is_multiple_of(taps))
        .min_by_key(|r| {
            (
                columns.div_ceil(r.lanes as usize) * r.lanes as usize,
                -r.lanes,
            )
        })
}

/// Packs the product's `[C][O·KH·KW]` matrix (the weight tensor as it is, rows of
/// input channels) into blocks of `lanes` columns, `[block][c][lane]`, the last block
/// zero-padded: the layout a 1×1 convolution's micro-kernel tiles read.
fn pack_product(
    w: &[f32],
    c: usize,
    columns: usize,
    lanes: usize,
    slab: &ConstantSlab,
) -> AlignedBuf {
    let blocks = columns.div_ceil(lanes);
    slab.f32_with(blocks * c * lanes, |out| {
        for (i, d) in out.iter_mut().enumerate() {
            let (block, ci, lane) = (i / (c * lanes), i / lanes % c, i % lanes);
            let column = block * lanes + lane;
            if column < columns {
                *d = w.get(ci * columns + column).copied().unwrap_or(0.0);
            }
        }
    })
}

/// A non-overlapping transposed convolution as one product (see [`product_routine`]):
/// per input row, each block of `lanes` product columns (output channels × taps) is a
/// micro-kernel call per run of pixels, its sums left in a stack buffer `[pixel][lane]`;
/// then each output channel's taps go to its `KH×KW` patches, with the bias and the
/// post-ops applied just before the one store. For 2×2 kernels a pixel's 4 taps of one
/// channel are one vector, and two pixels' vectors shuffle into the 4 output columns
/// of each of the 2 rows they cover; other kernels store element by element.
/// Parallel over input rows.
fn lower_as_product(
    cx: &mut Cx,
    g: &Geometry,
    routine: TileRoutine,
    operands: &[Value],
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let lanes = routine.lanes as usize;
    let taps = g.kh * g.kw;
    let columns = g.o * taps;
    let blocks = columns.div_ceil(lanes);
    let wdata = cx
        .const_weight(operands[1])
        .ok_or_else(|| cx.unsupported("conv_transpose2d as a product needs constant weights"))?;
    let c = g.c;
    let recipe = format!("conv_transpose product c{c} columns{columns} lanes{lanes}");
    let wbuf = cx.constant_later_from(
        wdata,
        recipe,
        ("w_product", blocks * c * lanes),
        Box::new(move |slab| pack_product(wdata.as_f32(), c, columns, lanes, slab)),
    );
    let (x, bias) = (cx.buf(operands[0]), operands.get(2).map(|&v| cx.buf(v)));
    let pixels = g.w.clamp(1, routine.max_pixels as usize);
    let mut b = KernelBuilder::new(&format!(
        "conv_transpose2d_product_{}_o{}_k{}x{}_l{lanes}p{pixels}{}{}",
        dims_name(&[g.n, g.c, g.h, g.w]),
        g.o,
        g.kh,
        g.kw,
        if bias.is_some() { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" },
    ));
    let mut args = vec![x, wbuf];
    let xa = b.arg("x", cx.len_of(x), Access::Read);
    let wa = b.arg("w_product", cx.len_of(wbuf), Access::Read);
    let bias = bias.map(|bb| {
        args.push(bb);
        b.arg("bias", cx.len_of(bb), Access::Read)
    });
    args.extend(epi.declare(&mut b));
    let oa = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    let [oh, ow] = g.out;
    let plane = (g.h * g.w) as i64;
    let out_index = |n: &Affine, o: &Affine, y: &Affine, col: &Affine| {
        n.scale(g.o as i64)
            .add(o)
            .scale((oh * ow) as i64)
            .add(&y.scale(ow as i64))
            .add(col)
    };
    // one stack buffer for the sums of every call (`[pixel][lane]`)
    let sums = b.local(pixels * lanes);
    b.set_parallel();
    b.for_loop(0, g.h as i64, 1, |b, y| {
        let y = Affine::var(y);
        b.for_loop(0, g.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            let row_tiles = |b: &mut KernelBuilder, blk: &Affine, valid: usize| {
                let tile = |b: &mut KernelBuilder, q0: &Affine, pixels: usize| {
                    let call = ConvTile {
                        lanes: lanes as i64,
                        pixels: pixels as i64,
                        rows: 1,
                        row_stride: 0,
                        taps: 1,
                        tap_stride: 0,
                        chans: c as i64,
                        chan_stride: plane,
                        pixel_stride: 1,
                        w_tap_stride: (c * lanes) as i64,
                        out_pixel_stride: lanes as i64,
                        out_vec_stride: 4,
                        out_block_stride: 16,
                        next_len: 0,
                        finish: 0,
                        accumulate: false,
                    };
                    let x_at = n.scale(c as i64 * plane).add(&y.scale(g.w as i64)).add(q0);
                    b.conv_tile(
                        BufPtr {
                            buf: xa,
                            index: x_at,
                        },
                        BufPtr {
                            buf: wa,
                            index: blk.scale((c * lanes) as i64),
                        },
                        BufPtr {
                            buf: sums,
                            index: Affine::constant(0),
                        },
                        None,
                        call,
                    );
                    // the sum of pixel `p`, product column `column` of this block, plus
                    // its channel's bias
                    let channel_of = |column: usize| {
                        blk.scale((lanes / taps) as i64)
                            .plus((column / taps) as i64)
                    };
                    let with_bias =
                        |b: &mut KernelBuilder, s: Expr, o: &Affine, w: Width| match bias {
                            Some(bb) => {
                                let bv = Expr::load(bb, o.clone(), s1);
                                let bv = if w == s1 { bv } else { Expr::splat_to(bv, w) };
                                b.let_(Expr::binary(BinOp::Add, s, bv), w)
                            }
                            None => s,
                        };
                    let store = |b: &mut KernelBuilder,
                                 s: Expr,
                                 o: &Affine,
                                 ty: &Affine,
                                 col: &Affine,
                                 w: Width| {
                        let s = with_bias(b, s, o, w);
                        let idx = [n.clone(), o.clone(), ty.clone(), col.clone()];
                        let val = epi.apply(b, s, &idx, w);
                        b.store(oa, out_index(&n, o, ty, col), val, w);
                    };
                    let vector = taps == 4 && g.kw == 2;
                    let pairs = if vector { pixels / 2 } else { 0 };
                    if vector {
                        // pixels `p, p+1` of one channel: [p k00, p k01, p k10, p k11] and the
                        // same of p+1 make output row 2y's columns 2q..2q+4 and row 2y+1's
                        for column in (0..valid).step_by(4) {
                            let o = channel_of(column);
                            b.for_loop(0, pairs as i64, 1, |b, pair| {
                                let p = Affine::var(pair).scale(2);
                                let at = |i: i64| p.plus(i).scale(lanes as i64).plus(column as i64);
                                let first = b.let_(Expr::load(sums, at(0), w4), w4);
                                let second = b.let_(Expr::load(sums, at(1), w4), w4);
                                let col = q0.add(&p).scale(2);
                                for ky in 0..2 {
                                    let m = if ky == 0 { [0, 1, 4, 5] } else { [2, 3, 6, 7] };
                                    let v = Expr::shuffle(first.clone(), second.clone(), m);
                                    let ty = y.scale(2).plus(ky);
                                    store(b, v, &o, &ty, &col, w4);
                                }
                            });
                        }
                    }
                    // the rest element by element: the pixels after the pairs, or every
                    // pixel for other kernels
                    for column in 0..valid {
                        let o = channel_of(column);
                        let (ky, kx) = ((column % taps / g.kw) as i64, (column % g.kw) as i64);
                        b.for_loop(2 * pairs as i64, pixels as i64, 1, |b, p| {
                            let p = Affine::var(p);
                            let s = Expr::load(sums, p.scale(lanes as i64).plus(column as i64), s1);
                            let ty = y.scale(g.kh as i64).plus(ky);
                            let col = q0.add(&p).scale(g.kw as i64).plus(kx);
                            store(b, s, &o, &ty, &col, s1);
                        });
                    }
                };
                let main = g.w / pixels * pixels;
                b.for_loop(0, main as i64, pixels as i64, |b, q| {
                    tile(b, &Affine::var(q), pixels)
                });
                if main < g.w {
                    tile(b, &Affine::constant(main as i64), g.w - main);
                }
            };
            b.for_blocks(columns, lanes, row_tiles);
        });
    });
    cx.step(b.finish(), args)
}

/// `packed[((g*KH + ky)*KW + kx)*Cg + c][o] = w[g*Cg + c][o][ky][kx]`: output channels
/// innermost, so a tap's channels are consecutive.
fn pack_weights(cx: &mut Cx, g: &Geometry, w: BufferId) -> Result<BufferId, Diagnostic> {
    let len = g.c * g.og * g.kh * g.kw;
    let packed = cx.temp("conv_transpose_weights", len);
    let mut b = KernelBuilder::new(&format!(
        "conv_transpose2d_pack_{}",
        dims_name(&[g.c, g.og, g.kh, g.kw])
    ));
    let wa = b.arg("w", cx.len_of(w), Access::Read);
    let pa = b.arg("packed", len, Access::Write);
    let s1 = Width::Scalar;
    b.for_loop(0, g.groups as i64, 1, |b, gi| {
        b.for_loop(0, g.cg as i64, 1, |b, ci| {
            let ch = Affine::var(gi).scale(g.cg as i64).add(&Affine::var(ci));
            b.for_loop(0, g.og as i64, 1, |b, o| {
                b.for_loop(0, g.kh as i64, 1, |b, ky| {
                    b.for_loop(0, g.kw as i64, 1, |b, kx| {
                        let (o, ky, kx) = (Affine::var(o), Affine::var(ky), Affine::var(kx));
                        let src = ch
                            .scale(g.og as i64)
                            .add(&o)
                            .scale((g.kh * g.kw) as i64)
                            .add(&ky.scale(g.kw as i64))
                            .add(&kx);
                        let tap = Affine::var(gi)
                            .scale(g.kh as i64)
                            .add(&ky)
                            .scale(g.kw as i64)
                            .add(&kx);
                        let dst = tap
                            .scale(g.cg as i64)
                            .add(&Affine::var(ci))
                            .scale(g.og as i64)
                            .add(&o);
                        b.store(pa, dst, Expr::load(wa, src, s1), s1);
                    });
                });
            });
        });
    });
    cx.step(b.finish(), vec![w, packed])?;
    Ok(packed)
}

/// The buffers a gather kernel reads and writes.
struct Args {
    x: BufId,
    w: BufId,
    bias: Option<BufId>,
    out: BufId,
}

/// The gather kernel for the output channels `channels` of every group, `lanes` (4 or 1)
/// channels per vector, tiles of up to 4 vectors.
#[allow(clippy::too_many_arguments)]
fn gather(
    cx: &mut Cx,
    a: &ConvTranspose2dAttrs,
    g: &Geometry,
    operands: &[Value],
    packed: BufferId,
    lanes: usize,
    channels: std::ops::Range<usize>,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let (x, bias) = (cx.buf(operands[0]), operands.get(2).map(|&v| cx.buf(v)));
    let [oh, ow] = g.out;
    let rows = phases(oh, a.pads[0], a.strides[0], a.dilations[0], g.kh, g.h);
    let cols = phases(ow, a.pads[1], a.strides[1], a.dilations[1], g.kw, g.w);
    let count = channels.len();
    let vectors = count / lanes;
    // vectors per tile: 4 when they divide evenly, else 1
    let tile = if vectors.is_multiple_of(4) { 4 } else { 1 };
    let mut b = KernelBuilder::new(&format!(
        "conv_transpose2d_{}_o{}_g{}_k{}x{}_s{}x{}_d{}x{}_p{}x{}_c{}x{lanes}{}",
        dims_name(&[g.n, g.c, g.h, g.w]),
        g.o,
        g.groups,
        g.kh,
        g.kw,
        a.strides[0],
        a.strides[1],
        a.dilations[0],
        a.dilations[1],
        a.pads[0],
        a.pads[1],
        channels.start,
        if bias.is_some() { "_bias" } else { "" },
    ));
    let mut args = vec![x, packed];
    let bufs = Args {
        x: b.arg("x", cx.len_of(x), Access::Read),
        w: b.arg("w", cx.len_of(packed), Access::Read),
        bias: bias.map(|bb| {
            args.push(bb);
            b.arg("bias", cx.len_of(bb), Access::Read)
        }),
        out: b.arg("out", cx.len_of(out), Access::Write),
    };
    args.push(out);
    args.extend(epi.declare(&mut b));
    let epi = &epi;
    let tiles = (vectors / tile) as i64;
    let first = channels.start as i64;
    let step = (tile * lanes) as i64;
    // one tile of output channels `o0 + ...` of group `gi`
    let body = |b: &mut KernelBuilder, t: LoopVar, gi: LoopVar| {
        let o0 = Affine::var(t).scale(step).plus(first);
        b.for_loop(0, g.n as i64, 1, |b, ni| {
            let ctx = Tile {
                g,
                bufs: &bufs,
                epi,
                lanes,
                tile,
                gi: Affine::var(gi),
                o0: o0.clone(),
                ni: Affine::var(ni),
            };
            for ry in &rows {
                for py in &ry.pieces {
                    b.for_loop(py.start, py.end, 1, |b, qy| {
                        for rx in &cols {
                            for px in &rx.pieces {
                                // runs of `span` pixels share each weight load (channels
                                // in lanes) or fill a vector (one channel, pixels in lanes)
                                let span = if lanes == 4 { 2 } else { 4 };
                                let len = px.end - px.start;
                                let runs_end = px.start + len / span * span;
                                for (from, to, n) in
                                    [(px.start, runs_end, span), (runs_end, px.end, 1)]
                                {
                                    b.for_loop(from, to, n, |b, qx| {
                                        let qx = Affine::var(qx);
                                        ctx.pixels(
                                            b,
                                            (ry, py, qy),
                                            (rx, px, qx),
                                            n as usize,
                                            a.strides,
                                        );
                                    });
                                }
                            }
                        }
                    });
                }
            }
        });
    };
    b.set_parallel();
    if tiles as usize >= g.groups {
        b.for_loop(0, tiles, 1, |b, t| {
            b.for_loop(0, g.groups as i64, 1, |b, gi| body(b, t, gi));
        });
    } else {
        b.for_loop(0, g.groups as i64, 1, |b, gi| {
            b.for_loop(0, tiles, 1, |b, t| body(b, t, gi));
        });
    }
    cx.step(b.finish(), args)
}

/// One tile of output channels of one image, for [`Tile::pixel`].
struct Tile<'a> {
    g: &'a Geometry,
    bufs: &'a Args,
    /// The fused post-ops, applied to each element as it is stored.
    epi: &'a Epilogue,
    /// Channels per vector.
    lanes: usize,
    /// Vectors per tile.
    tile: usize,
    /// The group.
    gi: Affine,
    /// The tile's first output channel within the group.
    o0: Affine,
    /// The image.
    ni: Affine,
}

impl Tile<'_> {
    /// Output pixels `(s*qy + origin_y, s*(qx + p) + origin_x)` for `p < span`: the bias
    /// (or zero), plus every landing tap's `x · w` over the group's input channels,
    /// stored lane by lane. With channels in lanes (`lanes` 4) each pixel has its own
    /// accumulators and they share the weight vectors; with one channel (`lanes` 1) a
    /// span of 4 holds the 4 pixels in one vector, their inputs one vector load.
    fn pixels(
        &self,
        b: &mut KernelBuilder,
        (ry, py, qy): (&Phase, &Piece, LoopVar),
        (rx, px, qx): (&Phase, &Piece, Affine),
        span: usize,
        strides: [usize; 2],
    ) {
        let g = self.g;
        let pixels_in_lanes = self.lanes == 1 && span == 4;
        let wd = if self.lanes == 4 || pixels_in_lanes {
            Width::F32x4
        } else {
            Width::Scalar
        };
        // accumulators per pixel group (one group when pixels are in lanes)
        let groups = if pixels_in_lanes { 1 } else { span };
        let qy = Affine::var(qy);
        let oc0 = self.gi.scale(g.og as i64).add(&self.o0);
        let accs: Vec<Vec<_>> = (0..groups)
            .map(|_| {
                (0..self.tile)
                    .map(|v| {
                        let acc = b.var(wd);
                        let channel = oc0.plus((v * self.lanes) as i64);
                        let init = match self.bufs.bias {
                            Some(bb) if pixels_in_lanes => {
                                Expr::splat_to(Expr::load(bb, channel, Width::Scalar), wd)
                            }
                            Some(bb) => Expr::load(bb, channel, wd),
                            None => Expr::constant(0.0, wd),
                        };
                        b.assign(acc, init);
                        acc
                    })
                    .collect()
            })
            .collect();
        for &(ky, ty) in &py.taps {
            for &(kx, tx) in &px.taps {
                // input channels unrolled by UNROLL where they divide evenly: the loop's
                // own counting and branch were a large share of each step
                let unroll = if g.cg.is_multiple_of(UNROLL) {
                    UNROLL
                } else {
                    1
                };
                b.for_loop(0, g.cg as i64, unroll as i64, |b, ci| {
                    for j in 0..unroll as i64 {
                        let ci = Affine::var(ci).plus(j);
                        let ch = self.gi.scale(g.cg as i64).add(&ci);
                        let row_start = self
                            .ni
                            .scale(g.c as i64)
                            .add(&ch)
                            .scale(g.h as i64)
                            .add(&qy.plus(ty))
                            .scale(g.w as i64)
                            .add(&qx.plus(tx));
                        let tap = self
                            .gi
                            .scale(g.kh as i64)
                            .plus(ky)
                            .scale(g.kw as i64)
                            .plus(kx);
                        let row = tap.scale(g.cg as i64).add(&ci).scale(g.og as i64);
                        let weights: Vec<Expr> = (0..self.tile)
                            .map(|v| {
                                let wi = row.add(&self.o0).plus((v * self.lanes) as i64);
                                if pixels_in_lanes {
                                    let w1 = b.let_(
                                        Expr::load(self.bufs.w, wi, Width::Scalar),
                                        Width::Scalar,
                                    );
                                    b.let_(Expr::splat_to(w1, wd), wd)
                                } else {
                                    b.let_(Expr::load(self.bufs.w, wi, wd), wd)
                                }
                            })
                            .collect();
                        for (p, group) in accs.iter().enumerate() {
                            let xv = if pixels_in_lanes {
                                b.let_(Expr::load(self.bufs.x, row_start.clone(), wd), wd)
                            } else {
                                let at = row_start.plus(p as i64);
                                let x1 = b.let_(
                                    Expr::load(self.bufs.x, at, Width::Scalar),
                                    Width::Scalar,
                                );
                                b.let_(Expr::splat_to(x1, wd), wd)
                            };
                            for (&acc, wv) in group.iter().zip(&weights) {
                                b.assign(acc, Expr::fma(xv.clone(), wv.clone(), Expr::Var(acc)));
                            }
                        }
                    }
                });
            }
        }
        let [oh, ow] = g.out;
        let y = qy.scale(strides[0] as i64).plus(ry.origin);
        for (p, group) in accs.iter().enumerate() {
            for (v, &acc) in group.iter().enumerate() {
                for l in 0..wd.lanes() {
                    // lane l is channel l (channels in lanes) or pixel l (pixels in lanes)
                    let (pixel, channel) = if pixels_in_lanes { (l, 0) } else { (p, l) };
                    let x = qx
                        .plus(pixel as i64)
                        .scale(strides[1] as i64)
                        .plus(rx.origin);
                    let oc = oc0.plus((v * self.lanes + channel) as i64);
                    let at = self
                        .ni
                        .scale(g.o as i64)
                        .add(&oc)
                        .scale((oh * ow) as i64)
                        .add(&y.scale(ow as i64))
                        .add(&x);
                    let value = if wd.lanes() == 4 {
                        Expr::lane(Expr::Var(acc), l as u8)
                    } else {
                        Expr::Var(acc)
                    };
                    let idx = [self.ni.clone(), oc, y.clone(), x];
                    let value = self.epi.apply(b, value, &idx, Width::Scalar);
                    b.store(self.bufs.out, at, value, Width::Scalar);
                }
            }
        }
    }
}
