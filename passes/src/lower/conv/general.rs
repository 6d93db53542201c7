//! The general direct convolution: any channel count and weights from the graph, tiles
//! of output channels × vectors of 4 output columns (broadcast weight, vector input) over
//! a phase-split padded NCHW input.

use smelt_ir::loops::{Affine, Expr, KernelBuilder, VarId, Width};
use smelt_ir::{Diagnostic, Value};

use super::{Geo, TileAt, TileBufs};
use crate::lower::elementwise::{dims_name, Epilogue};
use crate::lower::{BufferId, Cx};

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

/// Output rows per register tile when a tile of `nt` channels × `nv` vectors holds few
/// accumulators: a depthwise convolution (one output channel per group) over a narrow
/// row has one or two, and each is one chain of `kh·kw` dependent FMAs, so the FMA
/// latency (4–5 cycles) bounds the kernel, not its throughput. Rows of the same channel
/// share each tap's broadcast weight and make independent chains: up to
/// [`MAX_ACCUMULATORS`] accumulators, at most the plane's rows. Measured on Zen 3 (AVX2):
/// MobileNetV3's 5×5 depthwise convs at 7² (960 channels, batch 2) ran at 9 GFLOP/s with
/// one row per tile.
fn rows_per_tile(nt: usize, nv: usize, oh: usize) -> usize {
    match nt {
        1 => (MAX_ACCUMULATORS / nv.max(1)).clamp(1, oh.max(1)),
        _ => 1,
    }
}

pub(super) fn conv_kernel(
    cx: &mut Cx,
    g: &Geo,
    xp: BufferId,
    operands: &[Value],
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let has_bias = operands.len() > 2;
    let mut b = KernelBuilder::new(&format!(
        "conv2d_{}_{}_g{}{}{}",
        dims_name(&[g.n, g.c, g.hp, g.phases * g.wq]),
        g.window_name(),
        g.groups,
        if has_bias { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" }
    ));
    let wb = cx.buf(operands[1]);
    let (bufs, args) = TileBufs::declare(&mut b, cx, xp, ("w", wb), operands, &mut epi, out);
    let (nt, nv) = tile_shape(g.ow, g.og);
    let og_main = g.og / nt * nt;
    // rows per tile where there are several groups (one row where rows are split across
    // threads, so that the split stays over single rows)
    let nr = match g.groups > 1 {
        true => rows_per_tile(nt, nv, g.oh),
        false => 1,
    };
    // the outermost loop is split across threads: groups when there are several, else rows
    let rows = |b: &mut KernelBuilder, grp: Affine, r: Affine, n: Affine| {
        let at = |ob: Affine| TileAt {
            n: n.clone(),
            o0: grp.scale(g.og as i64).add(&ob),
            c0: grp.scale(g.cg as i64),
            oh: r.clone(),
        };
        b.for_loop(0, og_main as i64, nt as i64, |b, ob| {
            row_of_tiles(b, g, &bufs, &epi, &at(Affine::var(ob)), (nt, nr), nv);
        });
        if og_main < g.og {
            let rest = g.og - og_main;
            row_of_tiles(
                b,
                g,
                &bufs,
                &epi,
                &at(Affine::constant(og_main as i64)),
                (rest, nr),
                nv,
            );
        }
    };
    b.set_parallel();
    if g.groups > 1 {
        b.for_loop(0, g.groups as i64, 1, |b, grp| {
            b.for_loop(0, g.n as i64, 1, |b, n| {
                // tiles of `nr` rows, the last one ending at the plane's last row (it may
                // overlap the previous tile, rewriting identical values)
                let main = g.oh / nr * nr;
                b.for_loop(0, main as i64, nr as i64, |b, r| {
                    rows(b, Affine::var(grp), Affine::var(r), Affine::var(n))
                });
                if main < g.oh {
                    let last = Affine::constant((g.oh - nr) as i64);
                    rows(b, Affine::var(grp), last, Affine::var(n));
                }
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

/// `nr` output rows from `at.oh` for `nt` channels (`(nt, nr)`): tiles of `nv` vectors,
/// then one tile covering the remaining columns whose last vector ends at the row's end —
/// it may overlap the previous tile, recomputing (and rewriting) identical values, so no
/// scalar tail is needed. Rows narrower than one vector use scalar lanes.
fn row_of_tiles(
    b: &mut KernelBuilder,
    g: &Geo,
    bufs: &TileBufs,
    epi: &Epilogue,
    at: &TileAt,
    (nt, nr): (usize, usize),
    nv: usize,
) {
    let shape = |nv: usize, w: Width| TileShape { nt, nr, nv, w };
    if g.ow < 4 {
        let q0 = Affine::constant(0);
        tile(b, g, bufs, epi, at, &q0, shape(g.ow, Width::Scalar));
        return;
    }
    let span = 4 * nv;
    let main = g.ow / span * span;
    b.for_loop(0, main as i64, span as i64, |b, q| {
        tile(
            b,
            g,
            bufs,
            epi,
            at,
            &Affine::var(q),
            shape(nv, Width::F32x4),
        );
    });
    if main < g.ow {
        let rest = (g.ow - main).div_ceil(4);
        let q0 = Affine::constant((g.ow - 4 * rest) as i64);
        tile(b, g, bufs, epi, at, &q0, shape(rest, Width::F32x4));
    }
}

/// The shape of a register tile: `nt` output channels × `nr` output rows × `nv` groups of
/// `w.lanes()` output columns.
#[derive(Clone, Copy)]
struct TileShape {
    nt: usize,
    nr: usize,
    nv: usize,
    w: Width,
}

/// A register tile of `shape` whose first row is `at.oh` and first column `q0`.
fn tile(
    b: &mut KernelBuilder,
    g: &Geo,
    bufs: &TileBufs,
    epi: &Epilogue,
    at: &TileAt,
    q0: &Affine,
    shape: TileShape,
) {
    let TileShape { nt, nr, nv, w } = shape;
    let lanes = w.lanes() as i64;
    // accs[t][i][j]: channel t, row i, vector j
    let accs: Vec<Vec<Vec<VarId>>> = (0..nt)
        .map(|_| {
            (0..nr)
                .map(|_| (0..nv).map(|_| b.var(w)).collect())
                .collect()
        })
        .collect();
    for (t, rows) in accs.iter().enumerate() {
        let init = match bufs.bias {
            Some(bias) => Expr::splat_to(Expr::load(bias, at.o0.plus(t as i64), Width::Scalar), w),
            None => Expr::constant(0.0, w),
        };
        for &acc in rows.iter().flatten() {
            b.assign(acc, init.clone());
        }
    }
    // One loop over input channels per tap: each body is one FMA per accumulator, so
    // the chains interleave and only the tap's shared operands are live. A tap is kernel
    // row `kh`, the input column offset `shift` in phase `phase`, and weight `k`.
    let tap = |b: &mut KernelBuilder, kh: &Affine, phase: usize, shift: &Affine, k: &Affine| {
        b.for_loop(0, g.cg as i64, 1, |b, c| {
            let c = Affine::var(c);
            let cin = at.c0.add(&c);
            // xs[i][j]: the input vector row i's vector j reads at this tap
            let xs: Vec<Vec<Expr>> = (0..nr)
                .map(|i| {
                    let row = at
                        .oh
                        .plus(i as i64)
                        .scale(g.stride[0] as i64)
                        .add(&kh.scale(g.dil[0] as i64));
                    (0..nv)
                        .map(|j| {
                            let q = q0.plus(j as i64 * lanes).add(shift);
                            let idx = g.x_index(&at.n, &cin, &row, phase, &q);
                            let load = Expr::load(bufs.x, idx, w);
                            if nt > 1 {
                                b.let_(load, w)
                            } else {
                                load
                            }
                        })
                        .collect()
                })
                .collect();
            for (t, rows) in accs.iter().enumerate() {
                let wi = g.w_index(&at.o0.plus(t as i64), &c, k);
                let wv = Expr::splat_to(Expr::load(bufs.w, wi, Width::Scalar), w);
                let wv = if nv * nr > 1 { b.let_(wv, w) } else { wv };
                for (row_xs, row_accs) in xs.iter().zip(rows) {
                    for (x, &acc) in row_xs.iter().zip(row_accs) {
                        b.assign(acc, Expr::fma(x.clone(), wv.clone(), Expr::Var(acc)));
                    }
                }
            }
        });
    };
    if nr > 1 && g.phases == 1 && g.cg == 1 {
        // a tile of several rows of one channel: the taps as loops, so that each block
        // holds one tap's loads (written out, the code generator schedules every load
        // of the tile first and spills most of them)
        b.for_loop(0, g.kh as i64, 1, |b, kh| {
            b.for_loop(0, g.kw as i64, 1, |b, kw| {
                let (kh, kw) = (Affine::var(kh), Affine::var(kw));
                let k = kh.scale(g.kw as i64).add(&kw);
                tap(b, &kh, 0, &kw.scale(g.dil[1] as i64), &k);
            });
        });
    } else {
        for kh in 0..g.kh {
            for kw in 0..g.kw {
                let col = kw * g.dil[1];
                let (phase, shift) = (col % g.phases, col / g.phases);
                let k = Affine::constant((kh * g.kw + kw) as i64);
                let kh = Affine::constant(kh as i64);
                tap(b, &kh, phase, &Affine::constant(shift as i64), &k);
            }
        }
    }
    let out_plane = (g.oh * g.ow) as i64;
    for (t, rows) in accs.iter().enumerate() {
        let o = at.o0.plus(t as i64);
        for (i, row_accs) in rows.iter().enumerate() {
            let oh = at.oh.plus(i as i64);
            for (j, &acc) in row_accs.iter().enumerate() {
                let col = q0.plus(j as i64 * lanes);
                let idx = [at.n.clone(), o.clone(), oh.clone(), col.clone()];
                let v = epi.apply(b, Expr::Var(acc), &idx, w);
                let dst =
                    at.n.scale(g.o as i64 * out_plane)
                        .add(&o.scale(out_plane))
                        .add(&oh.scale(g.ow as i64))
                        .add(&col);
                b.store(bufs.out, dst, v, w);
            }
        }
    }
}
