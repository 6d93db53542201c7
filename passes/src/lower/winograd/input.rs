//! The input transform `V = Bᵀ·d·B`: padded NCHW (4 tiles per vector, Cranelift code) or
//! channel blocks (a native routine per tile row) into `V`.

use smelt_ir::loops::winograd::WinogradInputRow;
use smelt_ir::loops::{Access, Affine, BufPtr, Expr, KernelBuilder, Width};
use smelt_ir::Diagnostic;

use super::{combine, Form, Plan};
use crate::lower::conv::{transpose4, CHANNEL_BLOCK};
use crate::lower::elementwise::dims_name;
use crate::lower::{BufferId, Cx};

/// `Bᵀ·d·B` of one input tile (or 4 tiles, one per lane), given `row(b, i)` = the α values
/// of tile row `i`; `store(b, ξ, value)` receives each transformed value.
fn input_tile(
    b: &mut KernelBuilder,
    form: Form,
    w: Width,
    row: &mut dyn FnMut(&mut KernelBuilder, usize) -> Vec<Expr>,
    store: &mut dyn FnMut(&mut KernelBuilder, usize, Expr),
) {
    let a = form.alpha();
    let bt = form.bt();
    // t[i][l] = Σ_j d[i][j]·Bᵀ[l][j]: transform each row as it is loaded
    let t: Vec<Vec<Expr>> = (0..a)
        .map(|i| {
            let d = row(b, i);
            bt.iter().map(|btl| combine(b, btl, &d, w)).collect()
        })
        .collect();
    // V[k][l] = Σ_i Bᵀ[k][i]·t[i][l]
    for l in 0..a {
        let col: Vec<Expr> = t.iter().map(|ti| ti[l].clone()).collect();
        for (k, btk) in bt.iter().enumerate() {
            let v = combine(b, btk, &col, w);
            store(b, k * a + l, v);
        }
    }
}

/// Padded NCHW input → `V[ξ][c][t]` (`t = (n·TH + th)·TW + tw`). Vectors hold one value
/// of 4 horizontally adjacent tiles: 4 row vectors (one per tile) are transposed into
/// the tiles' columns 0–3; for F4, columns 4 and 5 are columns 0 and 1 of the next
/// tile, shifted in from one more load. The last group overlaps the one before when the
/// tile count is not a multiple of 4 (it rewrites identical values); rows of fewer than
/// 4 tiles go tile by tile on scalars. Parallel over input channels.
pub(super) fn input_transform(
    cx: &mut Cx,
    p: &Plan,
    xp: BufferId,
    v: BufferId,
) -> Result<(), Diagnostic> {
    let form = p.form;
    let (m, a) = (form.m(), form.alpha());
    let [hp, wp] = p.padded();
    let tiles = p.tile_stride() as i64;
    let mut b = KernelBuilder::new(&format!(
        "winograd{m}_input_{}",
        dims_name(&[p.n, p.c, hp, wp])
    ));
    let xa = b.arg("padded", cx.len_of(xp), Access::Read);
    let va = b.arg("v", cx.len_of(v), Access::Write);
    let c_count = p.c as i64;
    let x_at = |n: &Affine, c: &Affine, row: &Affine, col: &Affine| {
        n.scale((p.c * hp * wp) as i64)
            .add(&c.scale((hp * wp) as i64))
            .add(&row.scale(wp as i64))
            .add(col)
    };
    let v_at = |xi: usize, c: &Affine, t: &Affine| c.plus(xi as i64 * c_count).scale(tiles).add(t);
    let tile_of = |n: &Affine, th: &Affine, tw: &Affine| {
        n.scale((p.th * p.tw) as i64)
            .add(&th.scale(p.tw as i64))
            .add(tw)
    };
    let w4 = Width::F32x4;
    b.set_parallel();
    b.for_loop(0, p.c as i64, 1, |b, c| {
        let c = Affine::var(c);
        b.for_loop(0, p.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            b.for_loop(0, p.th as i64, 1, |b, th| {
                let th = Affine::var(th);
                let group = |b: &mut KernelBuilder, tw0: &Affine| {
                    let t = tile_of(&n, &th, tw0);
                    let mut row = |b: &mut KernelBuilder, i: usize| -> Vec<Expr> {
                        let r = th.scale(m as i64).plus(i as i64);
                        let base = x_at(&n, &c, &r, &tw0.scale(m as i64));
                        let quads: Vec<Expr> = (0..4)
                            .map(|k| Expr::load(xa, base.plus((k * m) as i64), w4))
                            .collect();
                        let mut cols = transpose4(b, &quads);
                        if form == Form::F4 {
                            let next = b.let_(Expr::load(xa, base.plus(16), w4), w4);
                            let c4 = Expr::shuffle(cols[0].clone(), next.clone(), [1, 2, 3, 4]);
                            let c5 = Expr::shuffle(cols[1].clone(), next, [1, 2, 3, 5]);
                            cols.push(b.let_(c4, w4));
                            cols.push(b.let_(c5, w4));
                        }
                        cols
                    };
                    let mut store = |b: &mut KernelBuilder, xi: usize, val: Expr| {
                        b.store(va, v_at(xi, &c, &t), val, w4);
                    };
                    input_tile(b, form, w4, &mut row, &mut store);
                };
                let single = |b: &mut KernelBuilder, tw: &Affine| {
                    let t = tile_of(&n, &th, tw);
                    let mut row = |_: &mut KernelBuilder, i: usize| -> Vec<Expr> {
                        let r = th.scale(m as i64).plus(i as i64);
                        let base = x_at(&n, &c, &r, &tw.scale(m as i64));
                        (0..a)
                            .map(|j| Expr::load(xa, base.plus(j as i64), Width::Scalar))
                            .collect()
                    };
                    let mut store = |b: &mut KernelBuilder, xi: usize, val: Expr| {
                        b.store(va, v_at(xi, &c, &t), val, Width::Scalar);
                    };
                    input_tile(b, form, Width::Scalar, &mut row, &mut store);
                };
                let main = p.tw / 4 * 4;
                b.for_loop(0, main as i64, 4, |b, tw| group(b, &Affine::var(tw)));
                if main < p.tw {
                    if p.tw >= 4 {
                        group(b, &Affine::constant(p.tw as i64 - 4));
                    } else {
                        b.for_loop(0, p.tw as i64, 1, |b, tw| single(b, &Affine::var(tw)));
                    }
                }
            });
        });
    });
    cx.step(b.finish(), vec![xp, v])
}

/// Input in channel blocks (`[n][c/16][hp][wp][16]`, padded) → `V` in channel blocks,
/// `V[ξ][c/16][t][16]` (for the product, input channel `ξ·C + c` of tile `t`): a native
/// routine per tile row and channel block (`Stmt::WinogradInputRow`; an input in blocks
/// exists only on a micro-kernel, so the routines are there). Parallel over channel
/// blocks.
pub(super) fn input_transform_blocked(
    cx: &mut Cx,
    p: &Plan,
    xp: BufferId,
    v: BufferId,
) -> Result<(), Diagnostic> {
    let form = p.form;
    let m = form.m();
    let [hp, wp] = p.padded();
    let tiles = p.tile_stride() as i64;
    let unit = CHANNEL_BLOCK as i64;
    let blocks = (p.c / CHANNEL_BLOCK) as i64;
    let mut b = KernelBuilder::new(&format!(
        "winograd{m}_input_{}c16",
        dims_name(&[p.n, p.c, hp, wp])
    ));
    let xa = b.arg("padded", cx.len_of(xp), Access::Read);
    let va = b.arg("v", cx.len_of(v), Access::Write);
    let row = WinogradInputRow {
        alpha: form.alpha() as i64,
        tiles: p.tw as i64,
        x_row: wp as i64 * unit,
        x_tile: m as i64 * unit,
        v_plane: blocks * tiles * unit,
        v_tile: unit,
    };
    b.set_parallel();
    b.for_loop(0, blocks, 1, |b, cb| {
        let cb = Affine::var(cb);
        b.for_loop(0, p.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            let plane = n.scale(blocks).add(&cb).scale((hp * wp) as i64 * unit);
            b.for_loop(0, p.th as i64, 1, |b, th| {
                let th = Affine::var(th);
                let first = n.scale((p.th * p.tw) as i64).add(&th.scale(p.tw as i64));
                let x = plane.add(&th.scale(m as i64 * wp as i64 * unit));
                let at = cb.scale(tiles).add(&first).scale(unit);
                b.winograd_input_row(
                    BufPtr { buf: xa, index: x },
                    BufPtr { buf: va, index: at },
                    row,
                );
            });
        });
    });
    cx.step(b.finish(), vec![xp, v])
}
