//! Winograd row routines. The output row: one tile row of one block of 16 output
//! channels of the transformed product, `Y = Aᵀ·M·A` per tile, stored in channel blocks
//! (sums only; the bias and post-ops follow as store routines on the stored rows). The
//! input row: one tile row of one block of 16 input channels in channel blocks, `V =
//! Bᵀ·d·B` per tile, into the transformed input. They replace the Cranelift transforms
//! on f32x4, 3,000–5,500 bytes of machine code per kernel and the largest family of
//! YOLO's code generation after the convolutions.
//!
//! The input row's contract is the output row's with [`WinogradInputRowFn`], `(x, v,
//! alpha, tiles, x_row, x_tile, v_plane, v_tile)`, the formula and index sets of
//! `smelt_ir::loops::winograd::WinogradInputRow` (`footprints` bounds both); `v` must
//! not overlap `x`.
//!
//! # The contract (the safety argument)
//!
//! Every routine has the C signature of [`WinogradOutputRowFn`], `(m, out, alpha, tiles,
//! m_plane, m_tile, rows, cols, out_row)`: the shape's fields
//! ([`smelt_ir::loops::winograd::WinogradOutputRow`], whose docs give the formula) as
//! counts. A shape the contract refuses (`WinogradOutputRow::is_valid`) touches nothing.
//! The routines read exactly `m[ξ·m_plane + t·m_tile + lane]` for `ξ < α²`, `t < tiles`,
//! `lane < 16`, and write exactly `out[r·out_row + c·16 + lane]` for `r < rows`, `c <
//! cols`, `lane < 16` (`WinogradOutputRow::footprints` bounds both); `out` must not
//! overlap `m`. Loads and stores are unaligned.
//!
//! Every sum is formed as the Cranelift transform forms it (`combine` in
//! `passes/src/lower/winograd`): the first +1 term (or the first non-zero one, scaled),
//! then the others in index order as adds, subtracts and fused multiply-adds — so the
//! routines, the reference and the Cranelift kernels give the same bits.

#![allow(unsafe_code)]

use smelt_ir::loops::winograd::{
    combine_lead, WinogradInputRow, WinogradOutputRow, AT_F2, AT_F4, BT_F2, BT_F4,
};

/// The C-ABI type of every Winograd output row routine (see the module docs).
pub type WinogradOutputRowFn = unsafe extern "C" fn(
    m: *const f32,
    out: *mut f32,
    alpha: i64,
    tiles: i64,
    m_plane: i64,
    m_tile: i64,
    rows: i64,
    cols: i64,
    out_row: i64,
);

/// The C-ABI type of every Winograd input row routine (see the module docs).
pub type WinogradInputRowFn = unsafe extern "C" fn(
    x: *const f32,
    v: *mut f32,
    alpha: i64,
    tiles: i64,
    x_row: i64,
    x_tile: i64,
    v_plane: i64,
    v_tile: i64,
);

/// Lanes of a call: one channel block.
const LANES: usize = WinogradOutputRow::LANES as usize;

/// An input row's arguments as counts, or `None` for a shape the contract refuses.
#[derive(Clone, Copy)]
struct InputShape {
    alpha: usize,
    tiles: usize,
    x_row: usize,
    x_tile: usize,
    v_plane: usize,
    v_tile: usize,
}

impl InputShape {
    /// The shape of a routine's count arguments (`WinogradInputRow::words` order).
    fn of(words: [i64; 6]) -> Option<Self> {
        let row = WinogradInputRow::from_words(words);
        let [alpha, tiles, x_row, x_tile, v_plane, v_tile] = words.map(|v| v as usize);
        row.is_valid().then_some(InputShape {
            alpha,
            tiles,
            x_row,
            x_tile,
            v_plane,
            v_tile,
        })
    }
}

/// The input row's scalar oracle: the contract one lane at a time.
///
/// # Safety
///
/// Every index of the contract must lie inside the buffers behind `x` and `v`, which
/// must not overlap.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn winograd_input_row_reference(
    x: *const f32,
    v: *mut f32,
    alpha: i64,
    tiles: i64,
    x_row: i64,
    x_tile: i64,
    v_plane: i64,
    v_tile: i64,
) {
    let Some(s) = InputShape::of([alpha, tiles, x_row, x_tile, v_plane, v_tile]) else {
        return;
    };
    let bt: Vec<&[f32]> = match s.alpha {
        4 => BT_F2.iter().map(|r| &r[..]).collect(),
        _ => BT_F4.iter().map(|r| &r[..]).collect(),
    };
    let a = s.alpha;
    for t in 0..s.tiles {
        for lane in 0..LANES {
            // t_rows[i][l] = Σ_j Bᵀ[l][j]·d[i][j], row by row
            let t_rows: Vec<Vec<f32>> = (0..a)
                .map(|i| {
                    // SAFETY: the contract's reads (row i < α, tile t, column j < α).
                    let d: Vec<f32> = (0..a)
                        .map(|j| unsafe { *x.add(i * s.x_row + t * s.x_tile + j * LANES + lane) })
                        .collect();
                    bt.iter().map(|btl| combine_scalar(btl, &d)).collect()
                })
                .collect();
            for l in 0..a {
                let col: Vec<f32> = t_rows.iter().map(|r| r[l]).collect();
                for (k, btk) in bt.iter().enumerate() {
                    let at = (k * a + l) * s.v_plane + t * s.v_tile + lane;
                    // SAFETY: ξ = k·α + l < α², tile t, lane < 16: a contract write.
                    unsafe { *v.add(at) = combine_scalar(btk, &col) };
                }
            }
        }
    }
}

/// The arguments as counts, or `None` for a shape the contract refuses.
#[derive(Clone, Copy)]
struct Shape {
    alpha: usize,
    tiles: usize,
    m_plane: usize,
    m_tile: usize,
    rows: usize,
    cols: usize,
    out_row: usize,
}

impl Shape {
    /// The shape of a routine's count arguments (`WinogradOutputRow::words` order).
    fn of(words: [i64; 7]) -> Option<Shape> {
        let row = WinogradOutputRow::from_words(words);
        let [alpha, tiles, m_plane, m_tile, rows, cols, out_row] = words.map(|v| v as usize);
        row.is_valid().then_some(Shape {
            alpha,
            tiles,
            m_plane,
            m_tile,
            rows,
            cols,
            out_row,
        })
    }
}

/// `Σ k[i]·x[i]` for one lane, in `combine`'s order.
fn combine_scalar(k: &[f32], xs: &[f32]) -> f32 {
    let Some(first) = combine_lead(k) else {
        return 0.0;
    };
    let mut acc = if k[first] == 1.0 {
        xs[first]
    } else {
        xs[first] * k[first]
    };
    for (i, (&ki, &x)) in k.iter().zip(xs).enumerate() {
        if i == first || ki == 0.0 {
            continue;
        }
        acc = if ki == 1.0 {
            acc + x
        } else if ki == -1.0 {
            acc - x
        } else {
            x.mul_add(ki, acc)
        };
    }
    acc
}

/// The scalar oracle: the contract one lane at a time.
///
/// # Safety
///
/// Every index of the contract must lie inside the buffers behind `m` and `out`, which
/// must not overlap.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn winograd_output_row_reference(
    m: *const f32,
    out: *mut f32,
    alpha: i64,
    tiles: i64,
    m_plane: i64,
    m_tile: i64,
    rows: i64,
    cols: i64,
    out_row: i64,
) {
    let Some(s) = Shape::of([alpha, tiles, m_plane, m_tile, rows, cols, out_row]) else {
        return;
    };
    let at: Vec<&[f32]> = match s.alpha {
        4 => AT_F2.iter().map(|r| &r[..]).collect(),
        _ => AT_F4.iter().map(|r| &r[..]).collect(),
    };
    let (a, mu) = (s.alpha, s.alpha - 2);
    for t in 0..s.tiles {
        for lane in 0..LANES {
            // SAFETY: the contract's reads (ξ < α², tile t, lane < 16).
            let value = |xi: usize| unsafe { *m.add(xi * s.m_plane + t * s.m_tile + lane) };
            // columns[l][r] = Σ_k Aᵀ[r][k]·M[k·α + l], column by column
            let columns: Vec<Vec<f32>> = (0..a)
                .map(|l| {
                    let col: Vec<f32> = (0..a).map(|k| value(k * a + l)).collect();
                    at.iter().map(|atr| combine_scalar(atr, &col)).collect()
                })
                .collect();
            let sums: Vec<Vec<f32>> = (0..mu)
                .map(|r| columns.iter().map(|c| c[r]).collect())
                .collect();
            for (r, sr) in sums.iter().enumerate().take(s.rows) {
                for (j, atj) in at.iter().enumerate() {
                    let c = t * mu + j;
                    if c < s.cols {
                        // SAFETY: r < rows, c < cols, lane < 16: a contract write.
                        unsafe {
                            *out.add(r * s.out_row + c * LANES + lane) = combine_scalar(atj, sr)
                        };
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{
    winograd_input_row_avx2, winograd_input_row_avx512, winograd_output_row_avx2,
    winograd_output_row_avx512,
};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{InputShape, Shape, LANES};

    /// Generates one ISA's output row routine from its vector type and operations:
    /// `$load`, `$store`, `$add`, `$sub`, `$fma` (`x·k + acc`, fused), `$splat`, `$zero`,
    /// over `$lanes` lanes per vector (a call's 16 lanes in `16 / $lanes` passes).
    macro_rules! output_row {
        ($name:ident, $feature:literal, $v:ty, $lanes:expr, $load:ident, $store:ident,
         $add:ident, $sub:ident, $fma:ident, $splat:ident, $zero:ident) => {
            /// The routine of this ISA (the contract is the module docs').
            ///
            /// # Safety
            ///
            /// The CPU must have the ISA; every index of the contract must lie inside the
            /// buffers behind `m` and `out`, which must not overlap.
            #[target_feature(enable = $feature)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name(
                m: *const f32,
                out: *mut f32,
                alpha: i64,
                tiles: i64,
                m_plane: i64,
                m_tile: i64,
                rows: i64,
                cols: i64,
                out_row: i64,
            ) {
                let Some(s) = Shape::of([alpha, tiles, m_plane, m_tile, rows, cols, out_row])
                else {
                    return;
                };
                for part in 0..LANES / $lanes {
                    let lane0 = part * $lanes;
                    // SAFETY: forwarded contract, lanes lane0..lane0 + $lanes of each run.
                    unsafe {
                        match s.alpha {
                            4 => tiles_of::<4, 2>(&s, m.add(lane0), out.add(lane0)),
                            _ => tiles_of::<6, 4>(&s, m.add(lane0), out.add(lane0)),
                        }
                    }
                }

                /// `Aᵀ·x` of F(4×4, 3×3) for one column or row `x` of 6, each sum as
                /// `combine` forms it from `AT_F4` (checked against it by the tests).
                #[target_feature(enable = $feature)]
                #[inline]
                fn at_f4(x: &[$v; 6]) -> [$v; 4] {
                    let (two, four, eight) = ($splat(2.0), $splat(4.0), $splat(8.0));
                    let (m2, m8) = ($splat(-2.0), $splat(-8.0));
                    let y0 = $add($add($add($add(x[0], x[1]), x[2]), x[3]), x[4]);
                    let d = $sub(x[1], x[2]);
                    let y1 = $fma(x[4], m2, $fma(x[3], two, d));
                    let y2 = $fma(x[4], four, $fma(x[3], four, $add(x[1], x[2])));
                    let y3 = $add($fma(x[4], m8, $fma(x[3], eight, d)), x[5]);
                    [y0, y1, y2, y3]
                }

                /// `Aᵀ·x` of F(2×2, 3×3) for one column or row `x` of 4 (see [`at_f4`]).
                #[target_feature(enable = $feature)]
                #[inline]
                fn at_f2(x: &[$v; 4]) -> [$v; 2] {
                    [$add($add(x[0], x[1]), x[2]), $sub($sub(x[1], x[2]), x[3])]
                }

                /// `Aᵀ·x` of the form of `A` inputs.
                #[target_feature(enable = $feature)]
                #[inline]
                fn at_of<const A: usize, const MU: usize>(x: &[$v; A]) -> [$v; MU] {
                    let mut y = [$zero(); MU];
                    if A == 6 {
                        let mut x6 = [$zero(); 6];
                        x6.copy_from_slice(&x[..6]);
                        y[..4].copy_from_slice(&at_f4(&x6));
                    } else {
                        let mut x4 = [$zero(); 4];
                        x4.copy_from_slice(&x[..4]);
                        y[..2].copy_from_slice(&at_f2(&x4));
                    }
                    y
                }

                /// Every tile of the row, `$lanes` lanes from `m` and `out`.
                ///
                /// # Safety
                ///
                /// As the routine's, for these lanes.
                #[target_feature(enable = $feature)]
                unsafe fn tiles_of<const A: usize, const MU: usize>(
                    s: &Shape,
                    m: *const f32,
                    out: *mut f32,
                ) {
                    for t in 0..s.tiles {
                        // sums[l][r] = Σ_k Aᵀ[r][k]·M[k·α + l], column by column
                        let mut sums = [[$zero(); MU]; A];
                        for (l, sl) in sums.iter_mut().enumerate() {
                            let mut col = [$zero(); A];
                            for (k, v) in col.iter_mut().enumerate() {
                                let at = (k * A + l) * s.m_plane + t * s.m_tile;
                                // SAFETY: a contract read: ξ = k·α + l < α², tile t.
                                *v = unsafe { $load(m.add(at)) };
                            }
                            *sl = at_of::<A, MU>(&col);
                        }
                        for r in 0..s.rows.min(MU) {
                            let mut row = [$zero(); A];
                            for (l, v) in row.iter_mut().enumerate() {
                                *v = sums[l][r];
                            }
                            let y: [$v; MU] = at_of::<A, MU>(&row);
                            for (j, &yj) in y.iter().enumerate() {
                                let c = t * MU + j;
                                if c < s.cols {
                                    // SAFETY: r < rows, c < cols: a contract write.
                                    unsafe { $store(out.add(r * s.out_row + c * LANES), yj) };
                                }
                            }
                        }
                    }
                }
            }
        };
    }

    /// Generates one ISA's input row routine (the operations as for [`output_row`]).
    macro_rules! input_row {
        ($name:ident, $feature:literal, $v:ty, $lanes:expr, $load:ident, $store:ident,
         $add:ident, $sub:ident, $fma:ident, $splat:ident, $zero:ident) => {
            /// The input row routine of this ISA (the contract is the module docs').
            ///
            /// # Safety
            ///
            /// The CPU must have the ISA; every index of the contract must lie inside the
            /// buffers behind `x` and `v`, which must not overlap.
            #[target_feature(enable = $feature)]
            #[allow(clippy::too_many_arguments)]
            pub unsafe extern "C" fn $name(
                x: *const f32,
                v: *mut f32,
                alpha: i64,
                tiles: i64,
                x_row: i64,
                x_tile: i64,
                v_plane: i64,
                v_tile: i64,
            ) {
                let Some(s) = InputShape::of([alpha, tiles, x_row, x_tile, v_plane, v_tile]) else {
                    return;
                };
                for part in 0..LANES / $lanes {
                    let lane0 = part * $lanes;
                    // SAFETY: forwarded contract, lanes lane0..lane0 + $lanes of each run.
                    unsafe {
                        match s.alpha {
                            4 => tiles_of::<4>(&s, x.add(lane0), v.add(lane0)),
                            _ => tiles_of::<6>(&s, x.add(lane0), v.add(lane0)),
                        }
                    }
                }

                /// `Bᵀ·x` of F(4×4, 3×3) for one row or column `x` of 6, each sum as
                /// `combine` forms it from `BT_F4` (checked against it by the tests).
                #[target_feature(enable = $feature)]
                #[inline]
                fn bt_f4(x: &[$v; 6]) -> [$v; 6] {
                    let (four, two) = ($splat(4.0), $splat(2.0));
                    let (m5, m4, m2) = ($splat(-5.0), $splat(-4.0), $splat(-2.0));
                    [
                        $fma(x[2], m5, $fma(x[0], four, x[4])),
                        $add($fma(x[2], m4, $fma(x[1], m4, x[3])), x[4]),
                        $sub($fma(x[2], m4, $fma(x[1], four, x[4])), x[3]),
                        $fma(x[3], two, $sub($fma(x[1], m2, x[4]), x[2])),
                        $fma(x[3], m2, $sub($fma(x[1], two, x[4]), x[2])),
                        $fma(x[3], m5, $fma(x[1], four, x[5])),
                    ]
                }

                /// `Bᵀ·x` of F(2×2, 3×3) for one row or column `x` of 4 (see [`bt_f4`]).
                #[target_feature(enable = $feature)]
                #[inline]
                fn bt_f2(x: &[$v; 4]) -> [$v; 4] {
                    [
                        $sub(x[0], x[2]),
                        $add(x[1], x[2]),
                        $sub(x[2], x[1]),
                        $sub(x[1], x[3]),
                    ]
                }

                /// `Bᵀ·x` of the form of `A` values.
                #[target_feature(enable = $feature)]
                #[inline]
                fn bt_of<const A: usize>(x: &[$v; A]) -> [$v; A] {
                    let mut y = [$zero(); A];
                    if A == 6 {
                        let mut x6 = [$zero(); 6];
                        x6.copy_from_slice(&x[..6]);
                        y.copy_from_slice(&bt_f4(&x6)[..A]);
                    } else {
                        let mut x4 = [$zero(); 4];
                        x4.copy_from_slice(&x[..4]);
                        y.copy_from_slice(&bt_f2(&x4)[..A]);
                    }
                    y
                }

                /// Every tile of the row, `$lanes` lanes from `x` and `v`.
                ///
                /// # Safety
                ///
                /// As the routine's, for these lanes.
                #[target_feature(enable = $feature)]
                unsafe fn tiles_of<const A: usize>(s: &InputShape, x: *const f32, v: *mut f32) {
                    for t in 0..s.tiles {
                        // rows[i][l] = Σ_j Bᵀ[l][j]·d[i][j], row by row
                        let mut rows = [[$zero(); A]; A];
                        for (i, ri) in rows.iter_mut().enumerate() {
                            let mut d = [$zero(); A];
                            for (j, dj) in d.iter_mut().enumerate() {
                                let at = i * s.x_row + t * s.x_tile + j * LANES;
                                // SAFETY: a contract read: row i, tile t, column j.
                                *dj = unsafe { $load(x.add(at)) };
                            }
                            *ri = bt_of::<A>(&d);
                        }
                        for l in 0..A {
                            let mut col = [$zero(); A];
                            for (i, c) in col.iter_mut().enumerate() {
                                *c = rows[i][l];
                            }
                            for (k, &value) in bt_of::<A>(&col).iter().enumerate() {
                                let at = (k * A + l) * s.v_plane + t * s.v_tile;
                                // SAFETY: ξ = k·α + l < α², tile t: a contract write.
                                unsafe { $store(v.add(at), value) };
                            }
                        }
                    }
                }
            }
        };
    }

    /// Both routines of one ISA, from one list of its vector type and operations.
    macro_rules! isa_routines {
        ($input:ident, $output:ident, $($isa:tt)*) => {
            input_row!($input, $($isa)*);
            output_row!($output, $($isa)*);
        };
    }

    isa_routines!(
        winograd_input_row_avx512,
        winograd_output_row_avx512,
        "avx512f",
        __m512,
        16,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_add_ps,
        _mm512_sub_ps,
        _mm512_fmadd_ps,
        _mm512_set1_ps,
        _mm512_setzero_ps
    );

    isa_routines!(
        winograd_input_row_avx2,
        winograd_output_row_avx2,
        "avx2,fma",
        __m256,
        8,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_add_ps,
        _mm256_sub_ps,
        _mm256_fmadd_ps,
        _mm256_set1_ps,
        _mm256_setzero_ps
    );
}
