//! Padding kernels: the zero (or −∞) padded NCHW copy with stride phases, and the
//! channels-last (NHWC) padded copy the packed convolution reads.

use smelt_ir::loops::{Access, Affine, BufId, Expr, KernelBuilder, LoopVar, Width};

use super::transpose4;

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
                let from = (src, src_row.plus(x0 as i64), w - x0);
                copy_strided(b, from, sw, (dst, phase_at.plus(q0 as i64)), count);
            }
        });
    });
    b.finish()
}

/// Copies `count` elements, `stride` apart from `src` at `start` (a row with `avail`
/// elements from there), to consecutive elements of `dst` from `to`. Vector blocks of 4:
/// stride 1 loads them; stride 2 takes the even lanes of the 8 inputs from `2k` (so the
/// 8th must still be in the row); other strides and the rest go element by element.
fn copy_strided(
    b: &mut KernelBuilder,
    (src, start, avail): (BufId, Affine, usize),
    stride: usize,
    (dst, to): (BufId, Affine),
    count: usize,
) {
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    let vec_end = match stride {
        1 => count / 4 * 4,
        2 if avail >= 8 => (((avail - 8) / 8 + 1) * 4).min(count / 4 * 4),
        _ => 0,
    } as i64;
    let src_at = |k: &Affine| start.add(&k.scale(stride as i64));
    b.for_loop(0, vec_end, 4, |b, k| {
        let k = Affine::var(k);
        let v = if stride == 1 {
            Expr::load(src, src_at(&k), w4)
        } else {
            let lo = Expr::load(src, src_at(&k), w4);
            let hi = Expr::load(src, src_at(&k).plus(4), w4);
            Expr::shuffle(lo, hi, [0, 2, 4, 6])
        };
        b.store(dst, to.add(&k), v, w4);
    });
    b.for_loop(vec_end, count as i64, 1, |b, k| {
        let k = Affine::var(k);
        b.store(dst, to.add(&k), Expr::load(src, src_at(&k), s1), s1);
    });
}

/// Copies every `sh`-th row and `sw`-th column of `planes` planes of `h × w` pixels into
/// planes of `oh × ow` (the input a strided 1×1 convolution reads), so the convolution
/// itself runs at stride 1 on consecutive pixels. A pixel is one element (NCHW), or the
/// `unit` consecutive channels of a channel block (NCHW16c: a plane per block), copied
/// as vectors. Stride-2 columns of NCHW are gathered from pairs of vectors by shuffles.
#[allow(clippy::too_many_arguments)]
pub(super) fn subsample_kernel(
    planes: usize,
    unit: usize,
    [h, w]: [usize; 2],
    [sh, sw]: [usize; 2],
    [oh, ow]: [usize; 2],
    src_len: usize,
    dst_len: usize,
) -> smelt_ir::loops::Kernel {
    let blocked = if unit > 1 {
        format!("c{unit}")
    } else {
        String::new()
    };
    let mut b = KernelBuilder::new(&format!("subsample_{planes}x{h}x{w}{blocked}_s{sh}x{sw}"));
    let src = b.arg("x", src_len, Access::Read);
    let dst = b.arg("subsampled", dst_len, Access::Write);
    b.set_parallel();
    let unit = unit as i64;
    b.for_loop(0, planes as i64, 1, |b, p| {
        b.for_loop(0, oh as i64, 1, |b, i| {
            let src_row = Affine::var(p)
                .scale((h * w) as i64)
                .add(&Affine::var(i).scale((sh * w) as i64))
                .scale(unit);
            let dst_row = Affine::var(p)
                .scale((oh * ow) as i64)
                .add(&Affine::var(i).scale(ow as i64))
                .scale(unit);
            if unit == 1 {
                return copy_strided(b, (src, src_row, w), sw, (dst, dst_row), ow);
            }
            b.for_loop(0, ow as i64, 1, |b, j| {
                let from = src_row.add(&Affine::var(j).scale(sw as i64 * unit));
                let to = dst_row.add(&Affine::var(j).scale(unit));
                for lane in (0..unit).step_by(4) {
                    let v = Expr::load(src, from.plus(lane), Width::F32x4);
                    b.store(dst, to.plus(lane), v, Width::F32x4);
                }
            });
        });
    });
    b.finish()
}

/// Zeroes the padding rows (top `pt` and bottom rows) of a channels-last padded buffer
/// of `n` images × `hp` rows × `wp` columns × `c` channels.
pub(crate) fn nhwc_border_kernel(
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

/// Zeroes the left (`pl`) and right (past `pl + w`, up to `wp`) padding columns of one
/// channels-last row of `c` channels starting at `row_start`.
fn zero_side_columns(
    b: &mut KernelBuilder,
    dst: BufId,
    row_start: &Affine,
    c: usize,
    [pl, w, wp]: [usize; 3],
) {
    let (w4, s1) = (Width::F32x4, Width::Scalar);
    for (first, count) in [(0, pl), (pl + w, wp - pl - w)] {
        let len = (count * c) as i64;
        let at = |k: LoopVar| row_start.add(&Affine::var(k)).plus((first * c) as i64);
        let main = len / 4 * 4;
        b.for_loop(0, main, 4, |b, k| {
            b.store(dst, at(k), Expr::constant(0.0, w4), w4)
        });
        b.for_loop(main, len, 1, |b, k| {
            b.store(dst, at(k), Expr::constant(0.0, s1), s1)
        });
    }
}

/// Copies NCHW input rows — or, `from_blocks`, input in channel blocks
/// (`[n][c/16][h][w][16]`) — into a channels-last (NHWC) buffer padded by `pl` zero
/// columns on the left and up to `wp` on the right, at row offset `pt` (the border rows
/// are [`nhwc_border_kernel`]'s). From NCHW, blocks of 4 channels × 4 columns are
/// transposed in registers, leftover channels and columns going one element at a time;
/// from blocks, each pixel's channels are its blocks' 16-float runs, copied as vectors.
/// Parallel over input rows.
#[allow(clippy::too_many_arguments)]
pub(crate) fn nhwc_pad_kernel(
    n: usize,
    c: usize,
    from_blocks: bool,
    [h, w]: [usize; 2],
    [pt, pl]: [usize; 2],
    [hp, wp]: [usize; 2],
    src_len: usize,
    dst_len: usize,
) -> smelt_ir::loops::Kernel {
    let mut b = KernelBuilder::new(&format!(
        "pad_nhwc_{n}x{c}x{h}x{w}{}_t{pt}l{pl}_{hp}x{wp}",
        if from_blocks { "c16" } else { "" }
    ));
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
            zero_side_columns(b, dst, &row_start, c, [pl, w, wp]);
            if from_blocks {
                let unit = super::CHANNEL_BLOCK as i64;
                b.for_loop(0, w as i64, 1, |b, col| {
                    let col = Affine::var(col);
                    // channel `ch` (a multiple of 16) of pixel (r, col) starts its
                    // block's run
                    b.for_loop(0, ci, unit, |b, ch| {
                        let ch = Affine::var(ch);
                        let from = Affine::var(i)
                            .scale(ci * plane)
                            .add(&ch.scale(plane))
                            .add(&r.scale(w as i64).add(&col).scale(unit));
                        let to = dst_at(&col.plus(pl as i64), &ch);
                        for k in (0..unit).step_by(4) {
                            b.store(dst, to.plus(k), Expr::load(src, from.plus(k), w4), w4);
                        }
                    });
                });
                return;
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
            // Three channels (an RGB image): 4 columns of each plane interleaved into 12
            // consecutive floats by six shuffles, instead of 12 scalar copies at stride 3.
            let c4 = if c == 3 {
                b.for_loop(0, w4end, 4, |b, col| {
                    let col = Affine::var(col);
                    let mut ch = |k: i64| {
                        let v = Expr::load(src, src_at(&Affine::constant(k), &col), w4);
                        b.let_(v, w4)
                    };
                    let (r, g, bl) = (ch(0), ch(1), ch(2));
                    let mut shuf = |x: &Expr, y: &Expr, m: [u8; 4]| {
                        b.let_(Expr::shuffle(x.clone(), y.clone(), m), w4)
                    };
                    let rg01 = shuf(&r, &g, [0, 4, 1, 5]); // r0 g0 r1 g1
                    let gb12 = shuf(&g, &bl, [1, 5, 2, 6]); // g1 b1 g2 b2
                    let rg33 = shuf(&r, &g, [3, 7, 3, 7]); // r3 g3 r3 g3
                    let out = [
                        shuf(&rg01, &bl, [0, 1, 4, 2]), // r0 g0 b0 r1
                        shuf(&gb12, &r, [0, 1, 6, 2]),  // g1 b1 r2 g2
                        shuf(&bl, &rg33, [2, 4, 5, 3]), // b2 r3 g3 b3
                    ];
                    let first = dst_at(&col.plus(pl as i64), &Affine::constant(0));
                    for (k, v) in out.into_iter().enumerate() {
                        b.store(dst, first.plus(4 * k as i64), v, w4);
                    }
                });
                3
            } else {
                c4
            };
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
