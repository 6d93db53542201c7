//! The output transform `Y = Aᵀ·M·A` with bias and the fused post-ops, from `M` in blocks
//! of the product tile's lanes into NCHW or channel blocks.

use smelt_ir::loops::winograd::WinogradOutputRow;
use smelt_ir::loops::{Access, Affine, BinOp, BufId, BufPtr, Expr, KernelBuilder, Width};
use smelt_ir::Diagnostic;

use super::{combine, Form, Plan};
use crate::lower::conv::{transpose4, CHANNEL_BLOCK};
use crate::lower::elementwise::{dims_name, Epilogue};
use crate::lower::{BufferId, Cx};

/// `Aᵀ·M·A` of one tile (or 4 tiles, one per lane), given `load(ξ)`; returns the `m×m`
/// outputs by row.
fn output_tile(
    b: &mut KernelBuilder,
    form: Form,
    w: Width,
    load: &dyn Fn(usize) -> Expr,
) -> Vec<Vec<Expr>> {
    let (a, m) = (form.alpha(), form.m());
    let at = form.at();
    // s[r][l] = Σ_k Aᵀ[r][k]·M[k][l], one column of M at a time
    let mut s: Vec<Vec<Expr>> = vec![Vec::with_capacity(a); m];
    for l in 0..a {
        let col: Vec<Expr> = (0..a).map(|k| b.let_(load(k * a + l), w)).collect();
        for (r, atr) in at.iter().enumerate() {
            let v = combine(b, atr, &col, w);
            s[r].push(v);
        }
    }
    // Y[r][j] = Σ_l s[r][l]·Aᵀ[j][l]
    s.iter()
        .map(|sr| at.iter().map(|atj| combine(b, atj, sr, w)).collect())
        .collect()
}

/// `M` stored in blocks of `lanes` channels (`[ξ][o / lanes][t][lanes]`) → `Y = Aᵀ·M·A`
/// with bias and post-ops, NCHW or in channel blocks. Vectors hold the 4 channels of a
/// quad at one tile, so every tile and channel count runs on vectors. In channel blocks
/// each output pixel's vector is stored as it is; NCHW, a 4×4 transpose turns 4 output
/// columns × 4 channels into 4 channels × 4 columns for the post-ops and the stores
/// along W (F2 pairs horizontally adjacent tiles for its 4 columns), and columns past
/// the right edge are stored lane by lane. Each step of tiles runs every quad of one
/// block in turn, so a block's tiles of each ξ plane are read as one stream, each line
/// once. Parallel over tile rows or blocks; a last tile row reaching past the image is a
/// second, serial kernel.
pub(super) fn output_transform(
    cx: &mut Cx,
    p: &Plan,
    [mbuf, out]: [BufferId; 2],
    lanes: usize,
    bias: Option<BufferId>,
    mut epi: Epilogue,
) -> Result<(), Diagnostic> {
    let m = p.form.m();
    let full_rows = p.oh / m;
    let rows = |last| OutputRows { lanes, last };
    if full_rows > 0 {
        output_transform_rows(cx, p, [mbuf, out], bias, &mut epi, rows(None))?;
    }
    if full_rows < p.th {
        output_transform_rows(cx, p, [mbuf, out], bias, &mut epi, rows(Some(full_rows)))?;
    }
    Ok(())
}

/// Which kernel of [`output_transform`]: `M`'s block size, and every whole tile row
/// (`last` `None`, a parallel kernel) or tile row `last`, whose outputs reach past the
/// image's last row.
struct OutputRows {
    lanes: usize,
    last: Option<usize>,
}

/// One kernel of [`output_transform`].
fn output_transform_rows(
    cx: &mut Cx,
    p: &Plan,
    [mbuf, out]: [BufferId; 2],
    bias: Option<BufferId>,
    epi: &mut Epilogue,
    OutputRows { lanes, last }: OutputRows,
) -> Result<(), Diagnostic> {
    let form = p.form;
    let m = form.m();
    // the plane stride of `M` (see `Plan::tile_stride`)
    let tiles = p.tile_stride() as i64;
    let mut b = KernelBuilder::new(&format!(
        "winograd{m}_output_{}_lb{lanes}{}{}{}{}",
        dims_name(&[p.n, p.o, p.oh, p.ow]),
        if p.out_blocked { "_out16c" } else { "" },
        if bias.is_some() { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" },
        if last.is_some() { "_last_row" } else { "" }
    ));
    let ma = b.arg("m", cx.len_of(mbuf), Access::Read);
    let mut args = vec![mbuf];
    let ba: Option<BufId> = bias.map(|bb| {
        args.push(bb);
        b.arg("bias", cx.len_of(bb), Access::Read)
    });
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let w4 = Width::F32x4;
    // M[ξ][blocks][t][lanes]: quad `qi` of block `blk` at tile `t` (a partial last
    // block's quads past the output channels are never read)
    let blocks = p.o.div_ceil(lanes) as i64;
    let last_quads = (p.o % lanes) / 4;
    if last_quads > 0 && p.out_blocked {
        return Err(cx.unsupported("winograd into nchw16c with a partial block of channels"));
    }
    let m_at = |xi: usize, blk: &Affine, qi: &Affine, t: &Affine| {
        blk.plus(xi as i64 * blocks)
            .scale(tiles)
            .add(t)
            .scale(lanes as i64)
            .add(&qi.scale(4))
    };
    let out_at = |n: &Affine, o: &Affine, row: &Affine, col: &Affine| {
        n.scale((p.o * p.oh * p.ow) as i64)
            .add(&o.scale((p.oh * p.ow) as i64))
            .add(&row.scale(p.ow as i64))
            .add(col)
    };
    // in channel blocks, `[n][o / 16][oh][ow][16]`: the first of 4 channels at
    // `within` of block `block`
    let unit = CHANNEL_BLOCK as i64;
    let stored_at = |n: &Affine, [block, within]: [&Affine; 2], row: &Affine, col: &Affine| {
        n.scale((p.o / CHANNEL_BLOCK) as i64)
            .add(block)
            .scale((p.oh * p.ow) as i64)
            .add(&row.scale(p.ow as i64))
            .add(col)
            .scale(unit)
            .add(within)
    };
    let epi = &*epi;
    // tiles per step along a row: F2's 2 columns per tile are paired into 4
    let per_step = 4 / m;
    // `per_step` tiles of image `n` from tile column `tw0` of tile row `th`, of which
    // `rows` output rows and `cols` output columns are inside the image, for quad `qi`
    // of block `blk` (in channel blocks, `stored` = the output block and the quad's
    // first channel within it)
    let quad_step = |b: &mut KernelBuilder,
                     n: &Affine,
                     [blk, qi]: [&Affine; 2],
                     stored: Option<[&Affine; 2]>,
                     th: &Affine,
                     tw0: &Affine,
                     rows: usize,
                     cols: usize| {
        let o0 = blk.scale(lanes as i64).add(&qi.scale(4));
        let bias_v = ba.map(|bb| b.let_(Expr::load(bb, o0.clone(), w4), w4));
        // ys[k][r][j]: output (r, j) of tile `tw0 + k`, 4 channels
        let ys: Vec<Vec<Vec<Expr>>> = (0..per_step)
            .map(|k| {
                let t = n
                    .scale((p.th * p.tw) as i64)
                    .add(&th.scale(p.tw as i64))
                    .add(&tw0.plus(k as i64));
                let load = |xi: usize| Expr::load(ma, m_at(xi, blk, qi, &t), w4);
                output_tile(b, form, w4, &load)
            })
            .collect();
        let bias = |e: Expr| match &bias_v {
            Some(bv) => Expr::binary(BinOp::Add, e, bv.clone()),
            None => e,
        };
        if let Some(block) = stored {
            // the sums with their bias; the post-ops run over the finished tile row
            // (`finish_row`), one copy of them per kernel rather than one per output
            // pixel of a step: YOLO's SiLU epilogues were most of these kernels' code
            for r in 0..rows {
                let row = th.scale(m as i64).plus(r as i64);
                let pixels = ys.iter().flat_map(|y| y[r].iter().cloned());
                for (j, v) in pixels.enumerate().take(cols) {
                    let col = tw0.scale(m as i64).plus(j as i64);
                    b.store(ya, stored_at(n, block, &row, &col), bias(v), w4);
                }
            }
            return;
        }
        for r in 0..rows {
            let row = th.scale(m as i64).plus(r as i64);
            let columns: Vec<Expr> = ys
                .iter()
                .flat_map(|y| y[r].iter().cloned())
                .map(bias)
                .collect();
            let col = tw0.scale(m as i64);
            for (k, channel) in transpose4(b, &columns).into_iter().enumerate() {
                let o = o0.plus(k as i64);
                if cols >= 4 {
                    let idx = [n.clone(), o.clone(), row.clone(), col.clone()];
                    let val = epi.apply(b, channel, &idx, w4);
                    b.store(ya, out_at(n, &o, &row, &col), val, w4);
                    continue;
                }
                let channel = b.let_(channel, w4);
                for j in 0..cols {
                    let col = col.plus(j as i64);
                    let s = Expr::lane(channel.clone(), j as u8);
                    let idx = [n.clone(), o.clone(), row.clone(), col.clone()];
                    let s = epi.apply(b, s, &idx, Width::Scalar);
                    b.store(ya, out_at(n, &o, &row, &col), s, Width::Scalar);
                }
            }
        }
    };
    // every quad of block `blk` on the `per_step` tiles from column `tw0`; in channel
    // blocks, as the 4 quads of each output block of 16 channels
    let step = |b: &mut KernelBuilder,
                (blk, quads): (&Affine, usize),
                n: &Affine,
                th: &Affine,
                tw0: &Affine,
                rows,
                cols| {
        if !p.out_blocked {
            return b.for_loop(0, quads as i64, 1, |b, qi| {
                quad_step(b, n, [blk, &Affine::var(qi)], None, th, tw0, rows, cols)
            });
        }
        b.for_loop(0, (lanes / CHANNEL_BLOCK) as i64, 1, |b, half| {
            b.for_loop(0, 4, 1, |b, qq| {
                let (half, qq) = (Affine::var(half), Affine::var(qq));
                let qi = half.scale(4).add(&qq);
                let block = blk.scale((lanes / CHANNEL_BLOCK) as i64).add(&half);
                let within = qq.scale(4);
                let stored = Some([&block, &within]);
                quad_step(b, n, [blk, &qi], stored, th, tw0, rows, cols)
            })
        })
    };
    // in channel blocks, the post-ops over the `rows` output rows of tile row `th` of
    // block `blk` (its sums and bias stored), in place while they are in L1
    let finish_row = |b: &mut KernelBuilder, n: &Affine, blk: &Affine, th: &Affine, rows: usize| {
        if !p.out_blocked || epi.is_empty() {
            return;
        }
        b.for_loop(0, rows as i64, 1, |b, r| {
            let row = th.scale(m as i64).add(&Affine::var(r));
            b.for_loop(0, p.ow as i64, 1, |b, col| {
                let col = Affine::var(col);
                b.for_loop(0, (lanes / CHANNEL_BLOCK) as i64, 1, |b, half| {
                    b.for_loop(0, 4, 1, |b, qq| {
                        let (half, qq) = (Affine::var(half), Affine::var(qq));
                        let block = blk.scale((lanes / CHANNEL_BLOCK) as i64).add(&half);
                        let within = qq.scale(4);
                        let o0 = block.scale(unit).add(&within);
                        let at = stored_at(n, [&block, &within], &row, &col);
                        let sum = Expr::load(ya, at.clone(), w4);
                        let idx = [n.clone(), o0, row.clone(), col.clone()];
                        let val = epi.apply_along_channels(b, sum, &idx, &at, w4);
                        b.store(ya, at, val, w4);
                    })
                })
            })
        });
    };
    // In channel blocks with an epilogue the store routines apply (a bias, a residual, a
    // ReLU or hard-swish, after a SiLU, sigmoid or GELU): a native routine writes the
    // tile row's sums for each block of 16 of the lanes, and the routines finish each
    // output row in place — no Cranelift transform or epilogue at all (YOLO's
    // transforms were a quarter of its code generation).
    let finish = epi.native_finish().filter(|_| p.out_blocked);
    let halves = (lanes / CHANNEL_BLOCK) as i64;
    let native_row = |b: &mut KernelBuilder, n: &Affine, blk: &Affine, th: &Affine, rows: usize| {
        let Some(finish) = finish else {
            return;
        };
        let t0 = n.scale((p.th * p.tw) as i64).add(&th.scale(p.tw as i64));
        let zero = Affine::constant(0);
        let pixels = p.ow as i64;
        for half in 0..halves {
            let block = blk.scale(halves).plus(half);
            let out0 = stored_at(n, [&block, &zero], &th.scale(m as i64), &zero);
            b.winograd_output_row(
                BufPtr {
                    buf: ma,
                    index: m_at(0, blk, &Affine::constant(4 * half), &t0),
                },
                BufPtr {
                    buf: ya,
                    index: out0.clone(),
                },
                WinogradOutputRow {
                    alpha: form.alpha() as i64,
                    tiles: p.tw as i64,
                    m_plane: blocks * tiles * lanes as i64,
                    m_tile: lanes as i64,
                    rows: rows as i64,
                    cols: pixels,
                    out_row: pixels * unit,
                },
            );
            // the tile row's output rows are one run of the block: finished in one pass
            let run = BufPtr {
                buf: ya,
                index: out0,
            };
            let bias = ba.map(|buf| BufPtr {
                buf,
                index: block.scale(unit),
            });
            finish.emit(b, run, bias, rows as i64 * pixels, unit);
        }
    };
    // the tiles of tile row `th` (`rows` output rows of them inside the image) in one
    // block of `M`
    let block_row =
        |b: &mut KernelBuilder, n: &Affine, blk: (&Affine, usize), th: &Affine, rows| {
            if finish.is_some() {
                return native_row(b, n, blk.0, th, rows);
            }
            // tiles whose 4 columns (F2: pairs of tiles) are all inside the image
            let whole = p.ow / 4 * 4 / m;
            b.for_loop(0, whole as i64, per_step as i64, |b, tw| {
                step(b, blk, n, th, &Affine::var(tw), rows, 4)
            });
            if whole < p.tw {
                // the last columns: F4's last tile, or F2's last one or two tiles
                // (pairing an odd last tile with one past the grid, whose lanes are
                // never stored: see the length of `M` in `lower`)
                let tw0 = Affine::constant(whole as i64);
                step(b, blk, n, th, &tw0, rows, p.ow - whole * m);
            }
            finish_row(b, n, blk.0, th, rows);
        };
    let tile_row = |b: &mut KernelBuilder, th: &Affine, rows: usize| {
        b.for_loop(0, p.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            // quads of output channels, in blocks of the lanes' quads
            b.for_blocks(p.o / 4, lanes / 4, |b, blk, quads| {
                block_row(b, &n, (blk, quads), th, rows)
            });
        })
    };
    let full_rows = (p.oh / m) as i64;
    match last {
        // Threads share the longer of the two loops, or the even one when both are
        // short (7 tile rows split 4:3, 4 blocks 2:2); over blocks, each thread's
        // share of `M` is whole blocks.
        // (a partial last block would be a second loop beside the blocks': not the one
        // threads share)
        None if last_quads == 0
            && (blocks > full_rows || (full_rows < 8 && full_rows % 2 == 1 && blocks % 2 == 0)) =>
        {
            b.set_parallel();
            b.for_loop(0, blocks, 1, |b, blk| {
                b.for_loop(0, full_rows, 1, |b, th| {
                    b.for_loop(0, p.n as i64, 1, |b, n| {
                        let (n, blk) = (Affine::var(n), Affine::var(blk));
                        block_row(b, &n, (&blk, lanes / 4), &Affine::var(th), m)
                    })
                })
            });
        }
        None => {
            b.set_parallel();
            b.for_loop(0, full_rows, 1, |b, th| tile_row(b, &Affine::var(th), m));
        }
        Some(th) => tile_row(&mut b, &Affine::constant(th as i64), p.oh - th * m),
    }
    cx.step(b.finish(), args)
}
