//! The exponential on AVX-512F and AVX2 lanes, the expansion the JIT emits for
//! Cranelift code (`codegen/translate/math.rs`, which takes its constants from here):
//! `x` clamped to [−87.3, 88.3] (NaN goes through), `n = round(x·log₂e)` by the
//! `1.5·2²³` trick, Cody–Waite reduction `r = x − n·ln 2` in two parts, `1 + r + r²·P(r)`,
//! scaled by `2ⁿ` through the exponent bits: within 2 ulp of `e^x` inside the clamp.
//! What happens past the clamp (0 below, `+∞` above) is each routine's own rule.

/// Coefficients of `(e^r − 1 − r)/r²`, highest degree first.
pub(crate) const POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    0.5,
];
/// `1.5·2²³`: added to `x·log₂e`, it rounds to an integer in the low mantissa bits.
pub(crate) const MAGIC: f32 = 12_582_912.0;
/// The two parts of `−ln 2` for Cody–Waite reduction.
pub(crate) const LN2_HI: f32 = -0.693_359_4;
/// See [`LN2_HI`].
pub(crate) const LN2_LO: f32 = 2.121_944_4e-4;
/// The clamp's lower bound: below it `e^x` leaves f32's normal range.
pub(crate) const LOWEST: f32 = -87.3;
/// The clamp's upper bound.
pub(crate) const HIGHEST: f32 = 88.3;

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{exp256, exp512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{HIGHEST, LN2_HI, LN2_LO, LOWEST, MAGIC, POLY};

    /// `e^x` on 16 lanes, clamped (see the module docs).
    #[target_feature(enable = "avx512f")]
    pub(in crate::microkernels) fn exp512(input: __m512) -> __m512 {
        // the bound first: `max`/`min` return their second operand when either is NaN,
        // so a NaN goes through
        let x = _mm512_min_ps(
            _mm512_set1_ps(HIGHEST),
            _mm512_max_ps(_mm512_set1_ps(LOWEST), input),
        );
        let magic = _mm512_set1_ps(MAGIC);
        let t = _mm512_fmadd_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E), magic);
        let n = _mm512_sub_ps(t, magic);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
        let r = _mm512_fmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
        let mut p = _mm512_set1_ps(POLY[0]);
        for &c in &POLY[1..] {
            p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
        }
        let y = _mm512_fmadd_ps(
            p,
            _mm512_mul_ps(r, r),
            _mm512_add_ps(r, _mm512_set1_ps(1.0)),
        );
        let bias = _mm512_set1_epi32(127 - 0x4B40_0000);
        let e = _mm512_slli_epi32::<23>(_mm512_add_epi32(_mm512_castps_si512(t), bias));
        _mm512_mul_ps(y, _mm512_castsi512_ps(e))
    }

    /// `e^x` on 8 lanes, clamped (see the module docs).
    #[target_feature(enable = "avx2,fma")]
    pub(in crate::microkernels) fn exp256(input: __m256) -> __m256 {
        let x = _mm256_min_ps(
            _mm256_set1_ps(HIGHEST),
            _mm256_max_ps(_mm256_set1_ps(LOWEST), input),
        );
        let magic = _mm256_set1_ps(MAGIC);
        let t = _mm256_fmadd_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E), magic);
        let n = _mm256_sub_ps(t, magic);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
        let r = _mm256_fmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
        let mut p = _mm256_set1_ps(POLY[0]);
        for &c in &POLY[1..] {
            p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
        }
        let y = _mm256_fmadd_ps(
            p,
            _mm256_mul_ps(r, r),
            _mm256_add_ps(r, _mm256_set1_ps(1.0)),
        );
        let bias = _mm256_set1_epi32(127 - 0x4B40_0000);
        let e = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_castps_si256(t), bias));
        _mm256_mul_ps(y, _mm256_castsi256_ps(e))
    }
}
