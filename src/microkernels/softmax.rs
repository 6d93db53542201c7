//! Softmax-row routines: the softmax of one contiguous row on AVX-512F (16 lanes) or
//! AVX2 + FMA (8), called by JIT code for a softmax along a tensor's last axis (attention
//! scores), where Cranelift's f32x4 exp was the bound.
//!
//! # The contract (the safety argument)
//!
//! Every routine has the C signature of [`SoftmaxRowFn`], `(x, out, len)`. For `i < len`:
//!
//! ```text
//! out[i] = e^(x[i] − m) / Σ_j e^(x[j] − m),   m = max_j x[j]
//! ```
//!
//! with NaN anywhere in the row making every output NaN, and a row of `−∞` giving NaN
//! (as the reference interpreter). The routines read `x[0..len]` and write `out[0..len]`
//! only, the last partial vector under a mask (masked-off lanes are neither read nor
//! written); `out` may be `x` itself (each element is read before it is written, the
//! first two passes read only `x`). `len ≤ 0` touches nothing. Loads are unaligned.
//!
//! # Accuracy
//!
//! `e^r` is the JIT's own expansion (`src/codegen/translate/math.rs`): `x` clamped to
//! [−87.3, 88.3], `n = round(x·log₂e)`, Cody–Waite reduction `r = x − n·ln 2` in two
//! parts, a degree-7 polynomial, scaled by `2ⁿ` through the exponent bits: within 2 ulp
//! of `e^x` (the test checks 1e-6 relative on the row against f64). Below −87.3, where
//! `e^x` leaves f32's normal range, it is 0, so a masked score (`−∞`, or the dtype's
//! minimum as exporters write masks) gets exactly 0. The sum runs in
//! lane-parallel partial sums, so the result differs from Cranelift's kernel in the last
//! bits.

#![allow(unsafe_code)]

/// The C-ABI type of every softmax-row routine (see the module docs for the contract).
pub type SoftmaxRowFn = unsafe extern "C" fn(x: *const f32, out: *mut f32, len: i64);

/// The oracle: the contract computed element by element (max and sum in f32, the
/// exponential of the standard library).
///
/// # Safety
///
/// `x[0..len]` must be readable and `out[0..len]` writable (they may be the same).
pub unsafe extern "C" fn softmax_row_reference(x: *const f32, out: *mut f32, len: i64) {
    let Ok(len) = usize::try_from(len) else {
        return;
    };
    // SAFETY: `x[0..len]` is readable by the contract.
    let read = |i: usize| unsafe { *x.add(i) };
    let mut max = f32::NEG_INFINITY;
    let mut nan = false;
    for i in 0..len {
        let v = read(i);
        nan |= v.is_nan();
        max = max.max(v);
    }
    if nan {
        max = f32::NAN;
    }
    let mut sum = 0.0f32;
    for i in 0..len {
        sum += (read(i) - max).exp();
    }
    let inv = 1.0 / sum;
    for i in 0..len {
        let e = (read(i) - max).exp();
        // SAFETY: `out[0..len]` is writable by the contract.
        unsafe { *out.add(i) = e * inv };
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{softmax_row_avx2, softmax_row_avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use crate::microkernels::exp::{exp256 as exp256_clamped, exp512 as exp512_clamped, LOWEST};

    /// `e^x` on 16 lanes, exactly 0 below the clamp (a masked score, `−∞`); NaN stays.
    /// (`x ≤ 0` here, so there is no overflow rule.)
    #[target_feature(enable = "avx512f")]
    fn exp512(input: __m512) -> __m512 {
        let below = _mm512_cmp_ps_mask::<_CMP_NLT_UQ>(input, _mm512_set1_ps(LOWEST));
        _mm512_maskz_mov_ps(below, exp512_clamped(input))
    }

    /// The AVX-512F routine.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX-512F; `x[0..len]` must be readable and `out[0..len]`
    /// writable (they may be the same).
    #[target_feature(enable = "avx512f")]
    pub unsafe extern "C" fn softmax_row_avx512(x: *const f32, out: *mut f32, len: i64) {
        let Ok(len) = usize::try_from(len) else {
            return;
        };
        let full = len / 16 * 16;
        let tail: __mmask16 = ((1u32 << (len - full)) - 1) as u16;
        let load = |i: usize, m: __mmask16| {
            // SAFETY: the callers pass `i < len`: a whole vector below `full`, or the
            // tail under its mask.
            unsafe {
                if m == 0xFFFF {
                    _mm512_loadu_ps(x.add(i))
                } else {
                    _mm512_maskz_loadu_ps(m, x.add(i))
                }
            }
        };
        // pass 1: the max, and whether any lane is NaN
        let mut max = _mm512_set1_ps(f32::NEG_INFINITY);
        let mut nan: __mmask16 = 0;
        let mut i = 0;
        while i < len {
            let m = if i < full { 0xFFFF } else { tail };
            let v = load(i, m);
            nan |= _mm512_mask_cmp_ps_mask::<_CMP_UNORD_Q>(m, v, v);
            max = _mm512_mask_max_ps(max, m, max, v);
            i += 16;
        }
        let m = if nan != 0 {
            f32::NAN
        } else {
            _mm512_reduce_max_ps(max)
        };
        let mv = _mm512_set1_ps(m);
        // pass 2: the exponentials, stored, and their sum
        let mut sum = _mm512_setzero_ps();
        let mut i = 0;
        while i < len {
            let mk = if i < full { 0xFFFF } else { tail };
            let e = exp512(_mm512_sub_ps(load(i, mk), mv));
            sum = _mm512_mask_add_ps(sum, mk, sum, e);
            // SAFETY: as above.
            unsafe { _mm512_mask_storeu_ps(out.add(i), mk, e) };
            i += 16;
        }
        let inv = _mm512_set1_ps(1.0 / _mm512_reduce_add_ps(sum));
        // pass 3: scaled in place
        let mut i = 0;
        while i < len {
            let mk = if i < full { 0xFFFF } else { tail };
            // SAFETY: as above (`out[0..len]` was written by pass 2).
            unsafe {
                let e = _mm512_maskz_loadu_ps(mk, out.add(i));
                _mm512_mask_storeu_ps(out.add(i), mk, _mm512_mul_ps(e, inv));
            }
            i += 16;
        }
    }

    /// `e^x` on 8 lanes, exactly 0 below the clamp; NaN stays.
    #[target_feature(enable = "avx2,fma")]
    fn exp256(input: __m256) -> __m256 {
        let keep = _mm256_cmp_ps::<_CMP_NLT_UQ>(input, _mm256_set1_ps(LOWEST));
        _mm256_and_ps(exp256_clamped(input), keep)
    }

    /// Horizontal sum of 8 lanes.
    #[target_feature(enable = "avx2,fma")]
    fn hsum256(v: __m256) -> f32 {
        let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
    }

    /// The AVX2 + FMA routine: whole vectors of 8, the tail element by element.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA; `x[0..len]` must be readable and `out[0..len]`
    /// writable (they may be the same).
    #[target_feature(enable = "avx2,fma")]
    pub unsafe extern "C" fn softmax_row_avx2(x: *const f32, out: *mut f32, len: i64) {
        let Ok(len) = usize::try_from(len) else {
            return;
        };
        let full = len / 8 * 8;
        let read = |i: usize| {
            // SAFETY: the callers pass `i < len`.
            unsafe { *x.add(i) }
        };
        let mut max = _mm256_set1_ps(f32::NEG_INFINITY);
        let mut nan = _mm256_setzero_ps();
        let mut i = 0;
        while i < full {
            // SAFETY: a whole vector below `full`.
            let v = unsafe { _mm256_loadu_ps(x.add(i)) };
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(v, v));
            max = _mm256_max_ps(max, v);
            i += 8;
        }
        let mut lanes = [0.0f32; 8];
        // SAFETY: 8 floats into an array of 8.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), max) };
        let mut m = lanes.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut any_nan = _mm256_movemask_ps(nan) != 0;
        for j in full..len {
            let v = read(j);
            any_nan |= v.is_nan();
            m = m.max(v);
        }
        if any_nan {
            m = f32::NAN;
        }
        let mv = _mm256_set1_ps(m);
        let mut sum = _mm256_setzero_ps();
        let mut i = 0;
        while i < full {
            // SAFETY: a whole vector below `full`.
            unsafe {
                let e = exp256(_mm256_sub_ps(_mm256_loadu_ps(x.add(i)), mv));
                sum = _mm256_add_ps(sum, e);
                _mm256_storeu_ps(out.add(i), e);
            }
            i += 8;
        }
        let mut total = hsum256(sum);
        for j in full..len {
            // one lane of the same expansion, so the tail matches the vectors
            let e = _mm256_cvtss_f32(exp256(_mm256_set1_ps(read(j) - m)));
            total += e;
            // SAFETY: `j < len`.
            unsafe { *out.add(j) = e };
        }
        let inv = 1.0 / total;
        let iv = _mm256_set1_ps(inv);
        let mut i = 0;
        while i < full {
            // SAFETY: a whole vector below `full`.
            unsafe { _mm256_storeu_ps(out.add(i), _mm256_mul_ps(_mm256_loadu_ps(out.add(i)), iv)) };
            i += 8;
        }
        for j in full..len {
            // SAFETY: `j < len`.
            unsafe { *out.add(j) *= inv };
        }
    }
}
