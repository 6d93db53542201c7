//! Store-rows routines: a conv tile's sums, left on the stack by the tile routine, plus
//! their bias and a residual, through ReLU, hard-swish or nothing, stored into a result
//! laid out in channel blocks of 16 (`[pixel][16]`: one tile's rows are one contiguous run). The
//! Cranelift epilogue this replaces runs on f32x4 with a load, an add and a store per 4
//! lanes: a third of a 1×1 conv's time when its reduction is only 16 or 24 channels
//! long (MobileNetV3's 16→64 at 112², 0.40 of 1.10 ms at batch 2).
//!
//! # The contract (the safety argument)
//!
//! Every routine has the C signature of [`StoreRowsFn`], `(sums, bias, residual, out,
//! rows, lanes)`. For `i < rows·lanes`:
//!
//! ```text
//! v = sums[i] + (bias ? bias[i mod lanes] : 0)      (skipped without a bias)
//! v = v + (residual ? residual[i] : 0)              (skipped without a residual)
//! out[i] = v                                         (identity)
//! out[i] = v < 0 ? 0 : v                             (ReLU: a NaN kept, −0 kept)
//! t = fma(v, 1/6, 1/2); t = t < 0 ? 0 : t; t = 1 < t ? 1 : t
//! out[i] = v · t                                     (hard-swish: one rounding in fma)
//! ```
//!
//! reading `sums[0..rows·lanes]`, `residual[0..rows·lanes]` (when not null) and
//! `bias[0..lanes]` (when not null and there is a row), and writing `out[0..rows·lanes]`
//! only. `out` may be `sums` or `residual` (each element is read before it is written),
//! never overlap them otherwise. `lanes` must be a positive multiple of 16 and `rows ≥ 0`;
//! any other record touches nothing. The adds are the Cranelift epilogue's, in its order,
//! ReLU is its `max` (`a < 0 ? 0 : a`) and hard-swish its expression on a host with FMA
//! (which the routines need), so the result is bit for bit the same.
//!
//! The AVX2 routine serves AVX-512 hosts too: the loop is bound by its loads and stores,
//! which 512-bit vectors do not make wider on Zen 4.

#![allow(unsafe_code)]

use smelt_ir::loops::StoreActivation;

use super::row_counts as counts;

/// The C-ABI type of every store-rows routine (see the module docs for the contract).
pub type StoreRowsFn = unsafe extern "C" fn(
    sums: *const f32,
    bias: *const f32,
    residual: *const f32,
    out: *mut f32,
    rows: i64,
    lanes: i64,
);

/// The activations, as the const parameter of the shared loops.
const IDENTITY: u8 = 0;
const RELU: u8 = 1;
const HARDSWISH: u8 = 2;

/// The oracle of `act`'s routine: the contract element by element, on any host.
pub fn store_rows_reference(act: StoreActivation) -> StoreRowsFn {
    match act {
        StoreActivation::Identity => reference::<IDENTITY>,
        StoreActivation::Relu => reference::<RELU>,
        StoreActivation::HardSwish => reference::<HARDSWISH>,
    }
}

/// Hard-swish as the JIT's epilogue computes it (see the module docs).
fn hard_swish(v: f32) -> f32 {
    let t = v.mul_add(1.0 / 6.0, 0.5);
    let t = if t < 0.0 { 0.0 } else { t };
    let t = if 1.0 < t { 1.0 } else { t };
    v * t
}

/// The contract element by element for activation `ACT`.
///
/// # Safety
///
/// The contract's runs must be readable (`sums`, `residual` and `bias` unless null) and
/// writable (`out`).
unsafe extern "C" fn reference<const ACT: u8>(
    sums: *const f32,
    bias: *const f32,
    residual: *const f32,
    out: *mut f32,
    rows: i64,
    lanes: i64,
) {
    let Some((rows, lanes)) = counts(rows, lanes) else {
        return;
    };
    for i in 0..rows * lanes {
        // SAFETY: indices of the contract.
        unsafe {
            let mut v = *sums.add(i);
            if !bias.is_null() {
                v += *bias.add(i % lanes);
            }
            if !residual.is_null() {
                v += *residual.add(i);
            }
            *out.add(i) = match ACT {
                RELU if v < 0.0 => 0.0,
                HARDSWISH => hard_swish(v),
                _ => v,
            };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::store_rows_avx2;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{counts, StoreActivation, StoreRowsFn, HARDSWISH, IDENTITY, RELU};

    /// `act`'s routine on AVX2 (the contract is the module docs'), which AVX-512 hosts
    /// use too; call it only on a host with AVX2 and FMA (the AVX2 tiles' ISA).
    pub fn store_rows_avx2(act: StoreActivation) -> StoreRowsFn {
        match act {
            StoreActivation::Identity => rows_avx2::<IDENTITY>,
            StoreActivation::Relu => rows_avx2::<RELU>,
            StoreActivation::HardSwish => rows_avx2::<HARDSWISH>,
        }
    }

    /// The loop: 8 lanes at a time (`lanes` is a multiple of 16), the bias vector of
    /// each 8 lanes reloaded per row (it stays in L1).
    ///
    /// # Safety
    ///
    /// AVX2 and FMA on the host; the contract's runs readable and writable.
    #[target_feature(enable = "avx2,fma")]
    unsafe extern "C" fn rows_avx2<const ACT: u8>(
        sums: *const f32,
        bias: *const f32,
        residual: *const f32,
        out: *mut f32,
        rows: i64,
        lanes: i64,
    ) {
        let Some((rows, lanes)) = counts(rows, lanes) else {
            return;
        };
        let zero = _mm256_setzero_ps();
        let (sixth, half, one) = (
            _mm256_set1_ps(1.0 / 6.0),
            _mm256_set1_ps(0.5),
            _mm256_set1_ps(1.0),
        );
        // SAFETY: every offset is below rows·lanes (sums, residual, out) or lanes (bias),
        // the contract's runs; each vector's lanes are read before they are written.
        unsafe {
            for p in 0..rows {
                for l in (0..lanes).step_by(8) {
                    let i = p * lanes + l;
                    let mut v = _mm256_loadu_ps(sums.add(i));
                    if !bias.is_null() {
                        v = _mm256_add_ps(v, _mm256_loadu_ps(bias.add(l)));
                    }
                    if !residual.is_null() {
                        v = _mm256_add_ps(v, _mm256_loadu_ps(residual.add(i)));
                    }
                    if ACT == RELU {
                        // `v < 0 ? 0 : v`: keeps a NaN (the compare is false) and −0
                        let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(v, zero);
                        v = _mm256_blendv_ps(v, zero, negative);
                    }
                    if ACT == HARDSWISH {
                        // `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a :
                        // b`: with the constant first, `t < 0 ? 0 : t` and `1 < t ? 1 :
                        // t`, which keep a NaN `t` as the JIT's clamps do
                        let t = _mm256_fmadd_ps(v, sixth, half);
                        let t = _mm256_min_ps(one, _mm256_max_ps(zero, t));
                        v = _mm256_mul_ps(v, t);
                    }
                    _mm256_storeu_ps(out.add(i), v);
                }
            }
        }
    }
}
