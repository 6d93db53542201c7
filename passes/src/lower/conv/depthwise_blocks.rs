//! Depthwise convolutions on channel blocks (`nchw16c` in and out): a vector is 4
//! channels of one pixel, so every tap is a plain vector load at any stride — no padded
//! copy, no phase split, no shifted lanes — and an output pixel's 16 channels are 4
//! independent FMA chains.
//!
//! On NCHW planes a depthwise conv needs a padded (and, at stride 2, phase-split) copy of
//! its input and vectors of 4 output columns whose taps are shifted loads; MobileNetV3's
//! expanding layers at 112² (batch 2) and DBNet's at 320² spent as long in those copies
//! as in the convolution, and the 1×1 convs around them wrote and read NCHW planes
//! through 4×4 transposes. With the depthwise conv on blocks the layout pass keeps the
//! whole expand → depthwise → project chain in blocks.
//!
//! The padding is the taps a border pixel skips: output rows and columns whose window
//! reaches past the input are peeled off, each with its own (compile-time) range of
//! valid taps; the interior loops over full windows.
//!
//! Where the target has native routines, each output row is one call of the
//! blocked-depthwise-row routine (`Stmt::BlockedDepthwiseRow`, AVX2: a block is two
//! 8-lane vectors), which skips the border columns' taps itself; the kernel keeps only
//! the border rows' tap ranges and the epilogue — itself a call of a store-rows routine,
//! in place, when the row is of whole blocks and its post-ops are what one applies (a
//! ReLU, a hard-swish, a residual: MobileNetV3's). MobileNetV3-small's depthwise kernels
//! were 2,000–2,500 Cranelift instructions each with every border tile written out, and
//! half of its code generation time. The Cranelift kernel below stays for
//! `--kernels cranelift`.

use smelt_ir::loops::{
    Affine, BlockedDepthwiseRow, BufPtr, Expr, KernelBuilder, StoreActivation, VarId, Width,
};
use smelt_ir::{AlignedBuf, ConstantSlab, Diagnostic, Value};

use super::{Geo, TileBufs};
use crate::blocks::CHANNEL_BLOCK;
use crate::lower::elementwise::{dims_name, Epilogue};
use crate::lower::{BufferId, Cx};
use crate::scaled_rows::ScaledRows;

/// Output pixels per register tile: 3 pixels × 4 vectors of accumulators, the tap's
/// weight vector and one input vector are 14 of the 16 vector registers.
const TILE_PIXELS: usize = 3;

/// Vectors of 4 channels in a block.
const VECS: usize = CHANNEL_BLOCK / 4;

/// One axis of the window: input size, output size, stride, dilation, kernel size and
/// leading padding.
#[derive(Clone, Copy)]
struct Axis {
    input: usize,
    output: usize,
    stride: usize,
    dil: usize,
    kernel: usize,
    pad: usize,
}

impl Axis {
    /// The taps `[k0, k1)` that output position `o` reads inside the input.
    fn valid_taps(&self, o: usize) -> (usize, usize) {
        let start = (o * self.stride) as i64 - self.pad as i64;
        let inside = |k: usize| {
            let i = start + (k * self.dil) as i64;
            i >= 0 && i < self.input as i64
        };
        let k0 = (0..self.kernel).find(|&k| inside(k)).unwrap_or(self.kernel);
        let k1 = (k0..self.kernel)
            .find(|&k| !inside(k))
            .unwrap_or(self.kernel);
        (k0, k1.max(k0))
    }

    /// The outputs `[lo, hi)` whose whole window lies inside the input (empty when none
    /// does: then every output is a border one).
    fn interior(&self) -> (usize, usize) {
        let full = |o: usize| self.valid_taps(o) == (0, self.kernel);
        let lo = (0..self.output).find(|&o| full(o)).unwrap_or(self.output);
        let hi = (lo..self.output).find(|&o| !full(o)).unwrap_or(self.output);
        (lo, hi)
    }
}

/// The weights of `c` channels of `taps` taps each (`[c][taps]`, possibly a BN fold's
/// scaled rows) as `[stored / 16][taps][16]`: a tap's 16 channels are four vector loads
/// (a partial last block's padded lanes zero).
fn pack(w: &AlignedBuf, c: usize, stored: usize, taps: usize, slab: &ConstantSlab) -> AlignedBuf {
    let (src, scale) = ScaledRows::rows_of(w, c);
    slab.f32_with(stored * taps, |out| {
        for (ch, row) in src.chunks_exact(taps).take(c).enumerate() {
            let (block, lane) = (ch / CHANNEL_BLOCK, ch % CHANNEL_BLOCK);
            for (t, &x) in row.iter().enumerate() {
                let v = match scale {
                    Some(s) => ScaledRows::value(x, s[ch]),
                    None => x,
                };
                out[(block * taps + t) * CHANNEL_BLOCK + lane] = v;
            }
        }
    })
}

/// The depthwise conv `g` of an input of `[h, w]` pixels padded by `pads` (top, left),
/// from channel blocks into channel blocks, with constant weights (`operands[1]`), an
/// optional bias and the epilogue `epi` (whose operands walk the channels, see
/// [`Epilogue::runs_along_channels`]). A partial last block (channels a multiple of 4)
/// is computed as a whole one where its padded lanes come out zero by themselves — on
/// the native routine, zero in the input and the packed weights, with a bias padded by
/// zeros and an epilogue the store routines apply (each maps 0 to 0) — so one kernel
/// computes every block (MobileNetV3-large: 71 kernels → 61); otherwise it is a second
/// kernel computing only its real vectors and storing zeros in the padded ones, since
/// its bias and per-channel operands end at the real channels.
pub(super) fn kernel(
    cx: &mut Cx,
    g: &Geo,
    [h, w]: [usize; 2],
    [pt, pl]: [usize; 2],
    operands: &[Value],
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let wdata = cx.const_weight(operands[1]).ok_or_else(|| {
        cx.unsupported("a depthwise conv on channel blocks with weights from the graph")
    })?;
    if !g.c.is_multiple_of(4) {
        return Err(
            cx.unsupported("a depthwise conv on channel blocks needs whole vectors of 4 channels")
        );
    }
    let taps = g.kh * g.kw;
    let stored = g.c.next_multiple_of(CHANNEL_BLOCK);
    let recipe = format!("depthwise blocks c{} stored{stored} taps{taps}", g.c);
    let wbuf = cx.constant_later_from(
        wdata,
        recipe,
        ("w_blocked", stored * taps),
        Box::new({
            let c = g.c;
            move |slab| pack(wdata, c, stored, taps, slab)
        }),
    );
    let window = Window::of(g, [h, w], [pt, pl]);
    let full = g.c / CHANNEL_BLOCK;
    let partial = full * CHANNEL_BLOCK < g.c;
    // (an empty epilogue is one the store routine applies too: the identity)
    if partial && cx.opts.micro.is_some() && epi.as_store_rows().is_some() {
        // the bias padded with zeros (a bias from the graph: the partial block apart)
        let padded_bias = match operands.get(2) {
            None => Some(None),
            Some(&bias) => cx.padded_constant("bias_padded", bias, stored).map(Some),
        };
        if let Some(bias) = padded_bias {
            let blocks = BlockRange {
                first: 0,
                count: full + 1,
                real_vecs: VECS,
                bias,
            };
            return emit(cx, g, &window, blocks, (wbuf, operands), epi, out);
        }
    }
    let bias = operands.get(2).map(|&v| cx.buf(v));
    if full > 0 {
        let blocks = BlockRange {
            first: 0,
            count: full,
            real_vecs: VECS,
            bias,
        };
        emit(cx, g, &window, blocks, (wbuf, operands), epi.clone(), out)?;
    }
    if partial {
        let blocks = BlockRange {
            first: full,
            count: 1,
            real_vecs: (g.c - full * CHANNEL_BLOCK) / 4,
            bias,
        };
        emit(cx, g, &window, blocks, (wbuf, operands), epi, out)?;
    }
    Ok(())
}

/// Both axes of the window.
struct Window {
    rows: Axis,
    cols: Axis,
}

impl Window {
    /// The window of conv `g` over an input of `[h, w]` pixels padded by `[top, left]`.
    fn of(g: &Geo, [h, w]: [usize; 2], [top, left]: [usize; 2]) -> Window {
        let axis = |input, output, i: usize, kernel, pad| Axis {
            input,
            output,
            stride: g.stride[i],
            dil: g.dil[i],
            kernel,
            pad,
        };
        Window {
            rows: axis(h, g.oh, 0, g.kh, top),
            cols: axis(w, g.ow, 1, g.kw, left),
        }
    }
}

/// Channel blocks `first..first + count`, each with `real_vecs` vectors of 4 real
/// channels (the rest of its 16 lanes padding).
#[derive(Clone, Copy)]
struct BlockRange {
    first: usize,
    count: usize,
    real_vecs: usize,
    /// The bias the blocks read (the operand's, or a copy padded to whole blocks).
    bias: Option<BufferId>,
}

/// The kernels computing the blocks of `blocks`: on the native routine where the
/// target has it ([`emit_rows`]), else one Cranelift kernel, parallel over the blocks.
fn emit(
    cx: &mut Cx,
    g: &Geo,
    window: &Window,
    blocks: BlockRange,
    (wbuf, operands): (BufferId, &[Value]),
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if cx.opts.micro.is_some() {
        return emit_rows(cx, g, window, blocks, (wbuf, operands), epi, out);
    }
    emit_cranelift(cx, g, window, blocks, (wbuf, operands), epi, out)
}

/// Which rows a kernel of [`emit_rows`] computes, and what threads split.
#[derive(Clone, Copy, PartialEq)]
enum RowKernel {
    /// Every row, parallel over the blocks.
    All,
    /// The interior rows, parallel over them.
    Interior,
    /// The border rows, parallel over the blocks.
    Border,
}

/// The kernels of [`emit`] on the blocked-depthwise-row routine: per block, image and
/// output row, one call, which skips the border columns' taps itself; border rows call
/// it with their valid kernel rows. Threads split a kernel's top-level loop: the blocks
/// when there are enough of them, else the interior rows (MobileNetV3's 16-channel conv
/// at 112² is one block: one trip, one thread), the border rows then a kernel of their
/// own.
fn emit_rows(
    cx: &mut Cx,
    g: &Geo,
    &Window { rows, cols }: &Window,
    blocks: BlockRange,
    (wbuf, operands): (BufferId, &[Value]),
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let (row_lo, row_hi) = rows.interior();
    let borders = row_lo + (rows.output - row_hi);
    let kernels: &[RowKernel] = if blocks.count * g.n < 4 && row_hi - row_lo >= 4 {
        if borders > 0 {
            &[RowKernel::Interior, RowKernel::Border]
        } else {
            &[RowKernel::Interior]
        }
    } else {
        &[RowKernel::All]
    };
    let taps = (g.kh * g.kw) as i64;
    let stored_blocks = g.c.div_ceil(CHANNEL_BLOCK) as i64;
    let lane = CHANNEL_BLOCK as i64;
    let (h, w) = (rows.input as i64, cols.input as i64);
    let (oh, ow) = (g.oh as i64, g.ow as i64);
    let real_vecs = blocks.real_vecs;
    let (first, end) = (blocks.first as i64, (blocks.first + blocks.count) as i64);
    for &kind in kernels {
        let mut b = KernelBuilder::new(&format!(
            "conv2d_depthwise_c16_rows_{}_{}{}{}{}{}",
            dims_name(&[g.n, g.c, rows.input, cols.input]),
            g.window_name(),
            if real_vecs < VECS { "_partial" } else { "" },
            if operands.len() > 2 { "_bias" } else { "" },
            if epi.is_empty() { "" } else { "_fused" },
            match kind {
                RowKernel::All => "",
                RowKernel::Interior => "_interior",
                RowKernel::Border => "_border",
            }
        ));
        let x = cx.buf(operands[0]);
        let mut epi = epi.clone();
        let (bufs, args) =
            TileBufs::declare_with_bias(&mut b, cx, x, ("w", wbuf), blocks.bias, &mut epi, out);
        let (xa, wa, bias, ya) = (bufs.x, bufs.w, bufs.bias, bufs.out);
        // A ReLU or hard-swish alone (no residual) the routine applies to its sums before
        // it stores them: no pass over the row after it (a partial block's padded lanes
        // stay zero through either).
        let row_act = epi
            .as_store_rows()
            .filter(|(residual, act)| residual.is_none() && *act != StoreActivation::Identity)
            .map(|(_, act)| act);
        // output row `oy` of block `cb` of image `n`, over kernel rows [ky0, ky1): the
        // call, then the post-ops over the row in place
        let row = |b: &mut KernelBuilder, cb: &Affine, n: &Affine, oy: &Affine, (ky0, ky1)| {
            let plane = n.scale(stored_blocks).add(cb);
            let x_plane = plane.scale(h * w * lane);
            let y_row = plane.scale(oh * ow * lane).add(&oy.scale(ow * lane));
            let iy0 = oy
                .scale(rows.stride as i64)
                .plus((ky0 * rows.dil) as i64 - rows.pad as i64);
            let record = BlockedDepthwiseRow {
                pixels: ow,
                lanes: (4 * real_vecs) as i64,
                cols: w,
                stride: cols.stride as i64,
                dil: cols.dil as i64,
                pad: cols.pad as i64,
                taps: g.kw as i64,
                rows: (ky1 - ky0) as i64,
                x_row_stride: (rows.dil as i64) * w * lane,
                w_row_stride: g.kw as i64 * lane,
                act: row_act.unwrap_or(StoreActivation::Identity).index(),
            };
            let c0 = cb.scale(lane);
            let ptr = |buf, index| BufPtr { buf, index };
            b.blocked_depthwise_row(
                ptr(xa, x_plane.add(&iy0.scale(w * lane))),
                ptr(wa, cb.scale(taps).plus((ky0 * g.kw) as i64).scale(lane)),
                bias.map(|bb| ptr(bb, c0.clone())),
                ptr(ya, y_row.clone()),
                record,
            );
            if epi.is_empty() || row_act.is_some() {
                return;
            }
            // the routine added the bias; the rest on the store routine's 8-lane vectors
            if let Some((residual, act)) = epi.as_store_rows().filter(|_| real_vecs == VECS) {
                let run = ptr(ya, y_row.clone());
                let residual = residual.map(|r| ptr(r, y_row.clone()));
                b.store_rows(act, run.clone(), None, residual, run, ow, lane);
                return;
            }
            b.for_loop(0, ow, 1, |b, col| {
                let col = Affine::var(col);
                for v in 0..real_vecs {
                    let stored = y_row.add(&col.scale(lane)).plus(4 * v as i64);
                    let sum = Expr::load(ya, stored.clone(), Width::F32x4);
                    let idx = [n.clone(), c0.plus(4 * v as i64), oy.clone(), col.clone()];
                    let y = epi.apply_along_channels(b, sum, &idx, &stored, Width::F32x4);
                    b.store(ya, stored, y, Width::F32x4);
                }
            });
        };
        // the rows of `kind` of block `cb`, image `n` (the interior kernel's rows are its
        // parallel loop, outside)
        let block_rows = |b: &mut KernelBuilder, cb: &Affine, n: &Affine| {
            for oy in (0..row_lo).chain(row_hi..rows.output) {
                row(b, cb, n, &Affine::constant(oy as i64), rows.valid_taps(oy));
            }
            if kind == RowKernel::All {
                b.for_loop(row_lo as i64, row_hi as i64, 1, |b, oy| {
                    row(b, cb, n, &Affine::var(oy), (0, rows.kernel));
                });
            }
        };
        b.set_parallel();
        if kind == RowKernel::Interior {
            b.for_loop(row_lo as i64, row_hi as i64, 1, |b, oy| {
                b.for_loop(first, end, 1, |b, cb| {
                    b.for_loop(0, g.n as i64, 1, |b, n| {
                        let (cb, n) = (Affine::var(cb), Affine::var(n));
                        row(b, &cb, &n, &Affine::var(oy), (0, rows.kernel));
                    })
                })
            });
        } else {
            b.for_loop(first, end, 1, |b, cb| {
                b.for_loop(0, g.n as i64, 1, |b, n| {
                    block_rows(b, &Affine::var(cb), &Affine::var(n))
                })
            });
        }
        cx.step(b.finish(), args)?;
    }
    Ok(())
}

/// One Cranelift kernel computing the blocks of `blocks`, parallel over them.
fn emit_cranelift(
    cx: &mut Cx,
    g: &Geo,
    &Window { rows, cols }: &Window,
    blocks: BlockRange,
    (wbuf, operands): (BufferId, &[Value]),
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let (h, w) = (rows.input, cols.input);
    let taps = g.kh * g.kw;
    let stored_blocks = g.c.div_ceil(CHANNEL_BLOCK) as i64;
    let mut b = KernelBuilder::new(&format!(
        "conv2d_depthwise_c16_{}_{}{}{}{}",
        dims_name(&[g.n, g.c, h, w]),
        g.window_name(),
        if blocks.real_vecs < VECS {
            "_partial"
        } else {
            ""
        },
        if operands.len() > 2 { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" }
    ));
    let x = cx.buf(operands[0]);
    let (bufs, args) =
        TileBufs::declare_with_bias(&mut b, cx, x, ("w", wbuf), blocks.bias, &mut epi, out);
    let (xa, wa, bias, ya) = (bufs.x, bufs.w, bufs.bias, bufs.out);

    let w4 = Width::F32x4;
    let lane = CHANNEL_BLOCK as i64;
    let (h, w) = (h as i64, w as i64);
    let (oh, ow) = (g.oh as i64, g.ow as i64);
    let (row_lo, row_hi) = rows.interior();
    let (col_lo, col_hi) = cols.interior();
    let real_vecs = blocks.real_vecs;
    b.set_parallel();
    let (first, end) = (blocks.first as i64, (blocks.first + blocks.count) as i64);
    b.for_loop(first, end, 1, |b, cb| {
        let cb = Affine::var(cb);
        let c0 = cb.scale(lane);
        b.for_loop(0, g.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            let plane = n.scale(stored_blocks).add(&cb);
            let x_plane = plane.scale(h * w * lane);
            let y_plane = plane.scale(oh * ow * lane);
            // where vector `v` of output pixel (`oy`, `col`) is stored
            let stored_at = |oy: &Affine, col: &Affine, v: usize| {
                y_plane
                    .add(&oy.scale(ow * lane))
                    .add(&col.scale(lane))
                    .plus(4 * v as i64)
            };
            // `pixels` outputs of row `oy` from column `ox`, over taps [ky0, ky1) ×
            // [kx0, kx1) (the same for each of them); a window row's taps written out
            // (`written_out`: their loads are constant offsets from the row's start) or
            // a loop
            let tile = |b: &mut KernelBuilder,
                        oy: &Affine,
                        ox: &Affine,
                        pixels: usize,
                        (ky0, ky1): (usize, usize),
                        (kx0, kx1): (usize, usize),
                        written_out: bool| {
                let accs: Vec<Vec<VarId>> = (0..pixels)
                    .map(|_| (0..real_vecs).map(|_| b.var(w4)).collect())
                    .collect();
                for p in &accs {
                    for (v, &acc) in p.iter().enumerate() {
                        let init = match bias {
                            Some(bb) => Expr::load(bb, c0.plus(4 * v as i64), w4),
                            None => Expr::constant(0.0, w4),
                        };
                        b.assign(acc, init);
                    }
                }
                let iy0 = oy.scale(rows.stride as i64).plus(-(rows.pad as i64));
                let ix0 = ox.scale(cols.stride as i64).plus(-(cols.pad as i64));
                b.for_loop(ky0 as i64, ky1 as i64, 1, |b, ky| {
                    let iy = iy0.add(&Affine::var(ky).scale(rows.dil as i64));
                    let x_row = x_plane.add(&iy.scale(w * lane)).add(&ix0.scale(lane));
                    let w_row = cb
                        .scale(taps as i64)
                        .add(&Affine::var(ky).scale(g.kw as i64));
                    // the tap in column `kx` of the window row
                    let tap = |b: &mut KernelBuilder, kx: &Affine| {
                        let w_at = w_row.add(kx).scale(lane);
                        let x_at = x_row.add(&kx.scale((cols.dil as i64) * lane));
                        for v in 0..real_vecs {
                            let wv = b.let_(Expr::load(wa, w_at.plus(4 * v as i64), w4), w4);
                            for (p, acc) in accs.iter().enumerate() {
                                let col = (p * cols.stride) as i64;
                                let at = x_at.plus(col * lane + 4 * v as i64);
                                let xv = Expr::load(xa, at, w4);
                                let sum = Expr::fma(xv, wv.clone(), Expr::Var(acc[v]));
                                b.assign(acc[v], sum);
                            }
                        }
                    };
                    if written_out {
                        for kx in kx0..kx1 {
                            tap(b, &Affine::constant(kx as i64));
                        }
                    } else {
                        b.for_loop(kx0 as i64, kx1 as i64, 1, |b, kx| tap(b, &Affine::var(kx)));
                    }
                });
                // the sums (bias included); the row's post-ops run once it is complete
                for (p, acc) in accs.iter().enumerate() {
                    let col = ox.plus(p as i64);
                    for (v, &a) in acc.iter().enumerate() {
                        b.store(ya, stored_at(oy, &col, v), Expr::Var(a), w4);
                    }
                }
            };
            // the post-ops over the finished row `oy`, in place — one copy of the
            // epilogue per kind of row rather than per tile, which kept the kernels'
            // code (and so code generation) small — and a partial block's padding:
            // zeros, finite for its readers
            let finish_row = |b: &mut KernelBuilder, oy: &Affine| {
                if epi.is_empty() && real_vecs == VECS {
                    return;
                }
                b.for_loop(0, ow, 1, |b, col| {
                    let col = Affine::var(col);
                    if !epi.is_empty() {
                        for v in 0..real_vecs {
                            let stored = stored_at(oy, &col, v);
                            let sum = Expr::load(ya, stored.clone(), w4);
                            let idx = [n.clone(), c0.plus(4 * v as i64), oy.clone(), col.clone()];
                            let y = epi.apply_along_channels(b, sum, &idx, &stored, w4);
                            b.store(ya, stored, y, w4);
                        }
                    }
                    for v in real_vecs..VECS {
                        b.store(ya, stored_at(oy, &col, v), Expr::constant(0.0, w4), w4);
                    }
                });
            };
            // one output row: the left border columns one by one, the interior in tiles
            // of TILE_PIXELS (the last one narrower), the right border one by one. Only
            // the interior tiles of interior rows — nearly all the work — write their
            // taps out: the border code, a fifth of it for a 5×5 window, stays small
            // (written out, the border tiles made the kernels 10–21 KB of machine code
            // and doubled MobileNetV3's code generation time).
            let row = |b: &mut KernelBuilder, oy: &Affine, ky: (usize, usize), interior: bool| {
                for ox in (0..col_lo).chain(col_hi..cols.output) {
                    let at = Affine::constant(ox as i64);
                    tile(b, oy, &at, 1, ky, cols.valid_taps(ox), false);
                }
                let span = col_hi - col_lo;
                let main = span / TILE_PIXELS * TILE_PIXELS;
                let full = (0, cols.kernel);
                b.for_loop(
                    col_lo as i64,
                    (col_lo + main) as i64,
                    TILE_PIXELS as i64,
                    |b, ox| {
                        tile(b, oy, &Affine::var(ox), TILE_PIXELS, ky, full, interior);
                    },
                );
                if main < span {
                    let at = Affine::constant((col_lo + main) as i64);
                    tile(b, oy, &at, span - main, ky, full, false);
                }
                finish_row(b, oy);
            };
            for oy in (0..row_lo).chain(row_hi..rows.output) {
                row(b, &Affine::constant(oy as i64), rows.valid_taps(oy), false);
            }
            b.for_loop(row_lo as i64, row_hi as i64, 1, |b, oy| {
                row(b, &Affine::var(oy), (0, rows.kernel), true);
            });
        });
    });
    cx.step(b.finish(), args)
}
