//! The weight transform `U = G·g·Gᵀ`, computed at compile time in f64 into the layout the
//! batched product reads.

use smelt_ir::{AlignedBuf, ConstantSlab};

use super::Form;

/// `U[ξ][o][c] = (G·g[o][c]·Gᵀ)[ξ]` in f64, written straight into the layout the packed
/// product reads (`[ξ][o / lanes][c][lanes]`: a grouped 1×1 conv with group ξ), so the
/// only fresh buffer is the result.
///
/// `G` is applied through its structure ([`g_f2`], [`g_f4`]: rows in ± pairs, zeros
/// skipped), 8 flops per 3-vector instead of 18 multiply-adds, to 4 output channels at
/// once ([`V4`]), and the loops run over one block of `lanes` output channels and one
/// input channel at a time, so each of the α² planes of `U` is written as consecutive
/// runs (the generic version wrote 36 scattered values per filter and was 20% of
/// ResNet-50's compile). A BN-folded weight ([`ScaledRows::parts`](crate::scaled_rows::ScaledRows::parts)) is folded
/// filter by filter as it is read, bit-identical to reading its folded values, which
/// are then never written out.
pub(super) fn transform_weights(
    form: Form,
    o: usize,
    c: usize,
    w: &AlignedBuf,
    lanes: usize,
    slab: &ConstantSlab,
) -> AlignedBuf {
    let (w, scale) = crate::scaled_rows::ScaledRows::rows_of(w, o);
    match form {
        Form::F2 => transform_with::<4>(o, c, w, scale, lanes, g_f2, slab),
        Form::F4 => transform_with::<6>(o, c, w, scale, lanes, g_f4, slab),
    }
}

/// Four f64 values computed alike (one per output channel), so the transform's
/// arithmetic vectorizes.
///
/// The lanes are spelled out rather than built with `std::array::from_fn`, whose
/// closure is called through a type-erased helper that is not inlined: YOLO's
/// transforms took 6.7 ms of a 24 ms compile that way.
#[derive(Clone, Copy, Default)]
struct V4([f64; 4]);

impl std::ops::Add for V4 {
    type Output = V4;
    #[inline(always)]
    fn add(self, r: V4) -> V4 {
        let ([a, b, c, d], [e, f, g, h]) = (self.0, r.0);
        V4([a + e, b + f, c + g, d + h])
    }
}

impl std::ops::Sub for V4 {
    type Output = V4;
    #[inline(always)]
    fn sub(self, r: V4) -> V4 {
        let ([a, b, c, d], [e, f, g, h]) = (self.0, r.0);
        V4([a - e, b - f, c - g, d - h])
    }
}

impl std::ops::Mul<f64> for V4 {
    type Output = V4;
    #[inline(always)]
    fn mul(self, k: f64) -> V4 {
        let [a, b, c, d] = self.0;
        V4([a * k, b * k, c * k, d * k])
    }
}

/// G·(g₀, g₁, g₂) for F(2×2, 3×3): `G = [1 0 0; ½ ½ ½; ½ −½ ½; 0 0 1]`.
#[inline(always)]
fn g_f2([g0, g1, g2]: [V4; 3]) -> [V4; 4] {
    let s = (g0 + g2) * 0.5;
    let t = g1 * 0.5;
    [g0, s + t, s - t, g2]
}

/// G·(g₀, g₁, g₂) for F(4×4, 3×3): `G = [¼ 0 0; −⅙ −⅙ −⅙; −⅙ ⅙ −⅙; 1⁄24 1⁄12 ⅙;
/// 1⁄24 −1⁄12 ⅙; 0 0 1]`.
#[inline(always)]
fn g_f4([g0, g1, g2]: [V4; 3]) -> [V4; 6] {
    let s = (g0 + g2) * (-1.0 / 6.0);
    let t = g1 * (1.0 / 6.0);
    let p = g0 * (1.0 / 24.0) + g2 * (1.0 / 6.0);
    let q = g1 * (1.0 / 12.0);
    [g0 * 0.25, s - t, s + t, p + q, p - q, g2]
}

/// Input channels per staging pass of [`transform_with`].
const TRANSFORM_CHUNK: usize = 16;

/// [`transform_weights`] for α = `A`, with `g` applying G to 3-vectors, of the weights
/// `w` with output channel `o` scaled by `scale[o]` if given.
///
/// The α² planes of `U` are `o·c·4` bytes apart, often a multiple of 4 KiB, so writing
/// one value to each plane per filter maps all α² stores to the same cache sets and
/// every store misses (measured: ≈ 4 ns per value). Instead the values of
/// [`TRANSFORM_CHUNK`] input channels × `lanes` output channels are staged plane by plane
/// in a small buffer, then each plane's run (consecutive in `U`) is copied at once.
fn transform_with<const A: usize>(
    o: usize,
    c: usize,
    w: &[f32],
    scale: Option<&[f64]>,
    lanes: usize,
    g: impl Fn([V4; 3]) -> [V4; A],
    slab: &ConstantSlab,
) -> AlignedBuf {
    // whole blocks of `lanes` output channels, a partial last one zero-padded
    let plane = o.div_ceil(lanes.max(1)) * lanes * c;
    // every element is written: each plane's runs of staged values cover it whole (the
    // padded lanes are the transforms of zero filters)
    slab.f32_overwritten(A * A * plane, |u| {
        if lanes == 0 || w.len() < o * c * 9 {
            u.fill(0.0);
            return;
        }
        let run_len = TRANSFORM_CHUNK * lanes;
        let mut stage = vec![0.0f32; A * A * run_len];
        for ob in 0..o.div_ceil(lanes) {
            for c0 in (0..c).step_by(TRANSFORM_CHUNK) {
                let chunk = TRANSFORM_CHUNK.min(c - c0);
                for ci in 0..chunk {
                    for l0 in (0..lanes).step_by(4) {
                        // the 9 taps of 4 filters (zeros past the last output channel)
                        let mut f = [V4::default(); 9];
                        for j in 0..4 {
                            let oi = ob * lanes + l0 + j;
                            if oi >= o || l0 + j >= lanes {
                                continue;
                            }
                            let at = (oi * c + c0 + ci) * 9;
                            for (tap, &x) in f.iter_mut().zip(&w[at..at + 9]) {
                                tap.0[j] = f64::from(match scale {
                                    Some(s) => crate::scaled_rows::ScaledRows::value(x, s[oi]),
                                    None => x,
                                });
                            }
                        }
                        // G·f: column j of the filter → column j of an α×3 matrix
                        let cols: [[V4; A]; 3] = [
                            g([f[0], f[3], f[6]]),
                            g([f[1], f[4], f[7]]),
                            g([f[2], f[5], f[8]]),
                        ];
                        // (G·f)·Gᵀ: row k of G·f → row k of the α×α result
                        let [c0s, c1s, c2s] = &cols;
                        for (k, ((&a, &b), &d)) in c0s.iter().zip(c1s).zip(c2s).enumerate() {
                            let row = g([a, b, d]);
                            for (m, v) in row.into_iter().enumerate() {
                                let at = (k * A + m) * run_len + ci * lanes + l0;
                                let n = 4.min(lanes - l0);
                                for (d, x) in stage[at..at + n].iter_mut().zip(v.0) {
                                    *d = x as f32;
                                }
                            }
                        }
                    }
                }
                let at = (ob * c + c0) * lanes;
                for (xi, staged) in stage.chunks_exact(run_len).enumerate() {
                    let dst = xi * plane + at;
                    u[dst..dst + chunk * lanes].copy_from_slice(&staged[..chunk * lanes]);
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::conv::{Geo, PackedConv};
    use std::sync::Arc;

    /// A BN-folded weight (computed on read) and the same values computed here.
    fn folded(o: usize, per_row: usize) -> (AlignedBuf, AlignedBuf) {
        let w = smelt_ir::weights::random_f32(4, o * per_row, -2.0, 2.0);
        let alpha: Vec<f64> = (0..o).map(|i| 0.3 + i as f64 / 7.0).collect();
        let values: Vec<f32> = w
            .iter()
            .enumerate()
            .map(|(i, &x)| (f64::from(x) * alpha[i / per_row]) as f32)
            .collect();
        let lazy =
            crate::scaled_rows::ScaledRows::buffer(Arc::new(AlignedBuf::from_f32(&w)), alpha)
                .expect("whole rows");
        (lazy, AlignedBuf::from_f32(&values))
    }

    /// Folding the BN scale while transforming or packing gives the bits that
    /// transforming or packing the folded weight gives.
    #[test]
    fn folding_while_packing_is_bit_identical() {
        let bits = |b: &AlignedBuf| b.as_f32().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        // carved out of a slab's chunks, as lowering packs them
        let slab = ConstantSlab::new(8 << 20);
        let (o, c) = (16, 19);
        let (lazy, values) = folded(o, c * 9);
        assert!(crate::scaled_rows::ScaledRows::parts(&lazy).is_some());
        for form in [Form::F2, Form::F4] {
            for lanes in [4, 8] {
                assert_eq!(
                    bits(&transform_weights(form, o, c, &lazy, lanes, &slab)),
                    bits(&transform_weights(form, o, c, &values, lanes, &slab)),
                    "{form:?} lanes {lanes}"
                );
            }
        }
        for (kh, groups) in [(1, 1), (3, 1), (1, 2)] {
            let (cg, og) = (c, o / groups);
            let g = Geo {
                n: 1,
                c: cg * groups,
                o,
                cg,
                og,
                groups,
                kh,
                kw: kh,
                oh: 4,
                ow: 4,
                stride: [1, 1],
                dil: [1, 1],
                hp: 4 + kh - 1,
                phases: 1,
                wq: 4 + kh - 1,
            };
            let (lazy, values) = folded(o, cg * kh * kh);
            let packed = PackedConv::new(&g, og, true, None);
            assert_eq!(
                bits(&packed.pack(&g, &lazy, &slab)),
                bits(&packed.pack(&g, &values, &slab)),
                "k{kh} groups {groups}"
            );
        }
    }

    /// The structured transform equals `G·g·Gᵀ` with the full matrices, in the packed
    /// layout, for both forms and both lane counts (to f32 rounding).
    #[test]
    fn weight_transform_matches_the_matrix_formula() {
        for form in [Form::F2, Form::F4] {
            for lanes in [4, 8] {
                let (o, c, a) = (16, 37, form.alpha());
                let w = smelt_ir::weights::random_f32(9, o * c * 9, -2.0, 2.0);
                let buf = AlignedBuf::from_f32(&w);
                let got = transform_weights(form, o, c, &buf, lanes, &ConstantSlab::new(0));
                let g = form.g();
                for oi in 0..o {
                    for ci in 0..c {
                        let f = &w[(oi * c + ci) * 9..][..9];
                        let at = (oi / lanes * c + ci) * lanes + oi % lanes;
                        for k in 0..a {
                            for l in 0..a {
                                let mut want = 0.0f64;
                                for i in 0..3 {
                                    for j in 0..3 {
                                        want += g[k][i] * f64::from(f[3 * i + j]) * g[l][j];
                                    }
                                }
                                let v = got.as_f32()[(k * a + l) * o * c + at];
                                assert!(
                                    (f64::from(v) - want).abs() <= 1e-6 * want.abs().max(1.0),
                                    "{form:?} lanes {lanes} o {oi} c {ci} ξ ({k},{l}): {v} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
