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
//!
//! # Store-planes routines
//!
//! The same epilogue for a result laid out by channel planes (NCHW: a YOLO head's 255
//! channels, read by a reshape and transpose): the tile's `[pixel][lanes]` sums are
//! stored transposed, each channel's pixels one contiguous run of its plane. The
//! Cranelift epilogue this replaces transposed 4×4 blocks with shuffles, a block of code
//! per partial channel vector and per tail pixel: YOLO's three head convs were 16 of
//! its 61 ms of code generation. Signature [`StorePlanesFn`], `(sums, bias, out,
//! pixels, channels, lanes, plane)`; for `p < pixels`, `c < channels`:
//!
//! ```text
//! v = sums[p·lanes + c] + (bias ? bias[c] : 0)       (skipped without a bias)
//! out[c·plane + p] = act(v)                          (act as above)
//! ```
//!
//! reading `sums[0..(pixels − 1)·lanes + channels]` and `bias[0..channels]` (when not
//! null and there is a pixel), writing those elements of `out` only, which must not
//! overlap the sums. `pixels ≥ 0`, `0 ≤ channels ≤ lanes`, `lanes` a positive multiple of
//! 16 and `plane ≥ pixels`; any other record touches nothing. Bit for bit the Cranelift
//! epilogue's, as above.

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

/// The C-ABI type of every store-planes routine (see the module docs for the contract).
pub type StorePlanesFn = unsafe extern "C" fn(
    sums: *const f32,
    bias: *const f32,
    out: *mut f32,
    pixels: i64,
    channels: i64,
    lanes: i64,
    plane: i64,
);

/// A store-planes record's counts as sizes, or `None` for a record that touches nothing.
fn plane_counts(
    pixels: i64,
    channels: i64,
    lanes: i64,
    plane: i64,
) -> Option<(usize, usize, usize, usize)> {
    let (pixels, lanes) = counts(pixels, lanes)?;
    let channels = usize::try_from(channels).ok().filter(|&c| c <= lanes)?;
    let plane = usize::try_from(plane).ok().filter(|&p| p >= pixels)?;
    Some((pixels, channels, lanes, plane))
}

/// The activations, as the const parameter of the shared loops (and of the conv
/// tiles' finish).
pub(crate) const IDENTITY: u8 = 0;
pub(crate) const RELU: u8 = 1;
pub(crate) const HARDSWISH: u8 = 2;
/// No activation at all, for the conv tiles: the sums are stored as they are.
pub(crate) const NO_FINISH: u8 = u8::MAX;

/// Evaluates `$call` with `$c` a `const u8` naming the activation `$act` (a
/// [`StoreActivation`]): how the routines that apply one turn a record's activation
/// into the constant parameter of their loops, dispatched once per call.
macro_rules! with_activation {
    ($act:expr, $c:ident => $call:expr) => {
        match $act {
            StoreActivation::Identity => {
                const $c: u8 = $crate::microkernels::store::IDENTITY;
                $call
            }
            StoreActivation::Relu => {
                const $c: u8 = $crate::microkernels::store::RELU;
                $call
            }
            StoreActivation::HardSwish => {
                const $c: u8 = $crate::microkernels::store::HARDSWISH;
                $call
            }
        }
    };
}
pub(crate) use with_activation;

/// The oracle of `act`'s routine: the contract element by element, on any host.
pub fn store_rows_reference(act: StoreActivation) -> StoreRowsFn {
    match act {
        StoreActivation::Identity => reference::<IDENTITY>,
        StoreActivation::Relu => reference::<RELU>,
        StoreActivation::HardSwish => reference::<HARDSWISH>,
    }
}

/// The oracle of `act`'s store-planes routine: the contract element by element.
pub fn store_planes_reference(act: StoreActivation) -> StorePlanesFn {
    match act {
        StoreActivation::Identity => planes_reference::<IDENTITY>,
        StoreActivation::Relu => planes_reference::<RELU>,
        StoreActivation::HardSwish => planes_reference::<HARDSWISH>,
    }
}

/// Hard-swish as the JIT's epilogue computes it (see the module docs).
fn hard_swish(v: f32) -> f32 {
    let t = v.mul_add(1.0 / 6.0, 0.5);
    let t = if t < 0.0 { 0.0 } else { t };
    let t = if 1.0 < t { 1.0 } else { t };
    v * t
}

/// `act` of one element, as the contract states it (also the conv tiles' finish).
pub(crate) fn activate_one(act: StoreActivation, v: f32) -> f32 {
    match act {
        StoreActivation::Identity => activate::<IDENTITY>(v),
        StoreActivation::Relu => activate::<RELU>(v),
        StoreActivation::HardSwish => activate::<HARDSWISH>(v),
    }
}

/// Activation `ACT` of one element, as the contract states it.
fn activate<const ACT: u8>(v: f32) -> f32 {
    match ACT {
        RELU if v < 0.0 => 0.0,
        HARDSWISH => hard_swish(v),
        _ => v,
    }
}

/// The store-planes contract element by element for activation `ACT`.
///
/// # Safety
///
/// The contract's elements must be readable (`sums`, `bias` unless null) and writable
/// (`out`).
unsafe extern "C" fn planes_reference<const ACT: u8>(
    sums: *const f32,
    bias: *const f32,
    out: *mut f32,
    pixels: i64,
    channels: i64,
    lanes: i64,
    plane: i64,
) {
    let Some((pixels, channels, lanes, plane)) = plane_counts(pixels, channels, lanes, plane)
    else {
        return;
    };
    for p in 0..pixels {
        for c in 0..channels {
            // SAFETY: indices of the contract.
            unsafe {
                let mut v = *sums.add(p * lanes + c);
                if !bias.is_null() {
                    v += *bias.add(c);
                }
                *out.add(c * plane + p) = activate::<ACT>(v);
            }
        }
    }
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
            *out.add(i) = activate::<ACT>(v);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::{activate16, activate8};
#[cfg(target_arch = "x86_64")]
pub use x86::{store_planes_avx2, store_rows_avx2};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{
        activate, counts, plane_counts, StoreActivation, StorePlanesFn, StoreRowsFn, HARDSWISH,
        IDENTITY, RELU,
    };

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
                    _mm256_storeu_ps(out.add(i), activate8::<ACT>(v));
                }
            }
        }
    }

    /// Activation `ACT` of 16 lanes with the same operations as [`activate8`] (the
    /// AVX-512 conv tiles' finish): the same bits.
    #[target_feature(enable = "avx512f")]
    #[inline]
    pub(crate) fn activate16<const ACT: u8>(v: __m512) -> __m512 {
        let zero = _mm512_setzero_ps();
        match ACT {
            RELU => {
                // `v < 0 ? 0 : v`: keeps a NaN (the compare is false) and −0
                let negative = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(v, zero);
                _mm512_mask_blend_ps(negative, v, zero)
            }
            HARDSWISH => {
                // the constants first, as in `activate8`: a NaN `t` is kept
                let t = _mm512_fmadd_ps(v, _mm512_set1_ps(1.0 / 6.0), _mm512_set1_ps(0.5));
                let t = _mm512_min_ps(_mm512_set1_ps(1.0), _mm512_max_ps(zero, t));
                _mm512_mul_ps(v, t)
            }
            _ => v,
        }
    }

    /// Activation `ACT` of 8 lanes, as the contract states it (also the AVX2 conv
    /// tile's finish).
    #[target_feature(enable = "avx2,fma")]
    #[inline]
    pub(crate) fn activate8<const ACT: u8>(v: __m256) -> __m256 {
        let zero = _mm256_setzero_ps();
        match ACT {
            RELU => {
                // `v < 0 ? 0 : v`: keeps a NaN (the compare is false) and −0
                let negative = _mm256_cmp_ps::<_CMP_LT_OQ>(v, zero);
                _mm256_blendv_ps(v, zero, negative)
            }
            HARDSWISH => {
                // `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a : b`: with
                // the constant first, `t < 0 ? 0 : t` and `1 < t ? 1 : t`, which keep a
                // NaN `t` as the JIT's clamps do
                let t = _mm256_fmadd_ps(v, _mm256_set1_ps(1.0 / 6.0), _mm256_set1_ps(0.5));
                let t = _mm256_min_ps(_mm256_set1_ps(1.0), _mm256_max_ps(zero, t));
                _mm256_mul_ps(v, t)
            }
            _ => v,
        }
    }

    /// `act`'s store-planes routine on AVX2 (the contract is the module docs'), which
    /// AVX-512 hosts use too; call it only on a host with AVX2 and FMA.
    pub fn store_planes_avx2(act: StoreActivation) -> StorePlanesFn {
        match act {
            StoreActivation::Identity => planes_avx2::<IDENTITY>,
            StoreActivation::Relu => planes_avx2::<RELU>,
            StoreActivation::HardSwish => planes_avx2::<HARDSWISH>,
        }
    }

    /// Blocks of 8 pixels × 8 channels: 8 row loads (plus the bias vector and the
    /// activation, on the channels), an 8×8 transpose in registers, 8 stores of 8
    /// pixels into 8 planes; the pixels and channels past the last whole block element
    /// by element, with the same operations.
    ///
    /// # Safety
    ///
    /// AVX2 and FMA on the host; the contract's elements readable and writable.
    #[target_feature(enable = "avx2,fma")]
    unsafe extern "C" fn planes_avx2<const ACT: u8>(
        sums: *const f32,
        bias: *const f32,
        out: *mut f32,
        pixels: i64,
        channels: i64,
        lanes: i64,
        plane: i64,
    ) {
        let Some((pixels, channels, lanes, plane)) = plane_counts(pixels, channels, lanes, plane)
        else {
            return;
        };
        let (whole_pixels, whole_channels) = (pixels / 8 * 8, channels / 8 * 8);
        // SAFETY: every sums offset is `p·lanes + c` and every out offset `c·plane + p`
        // with `p < pixels` and `c < channels`, the contract's elements; the bias is read
        // below `channels` only.
        unsafe {
            for c0 in (0..whole_channels).step_by(8) {
                let b = match bias.is_null() {
                    true => None,
                    false => Some(_mm256_loadu_ps(bias.add(c0))),
                };
                for p0 in (0..whole_pixels).step_by(8) {
                    let mut r = [_mm256_setzero_ps(); 8];
                    for (i, row) in r.iter_mut().enumerate() {
                        let v = _mm256_loadu_ps(sums.add((p0 + i) * lanes + c0));
                        let v = match b {
                            Some(b) => _mm256_add_ps(v, b),
                            None => v,
                        };
                        *row = activate8::<ACT>(v);
                    }
                    for (j, column) in transpose8(r).into_iter().enumerate() {
                        _mm256_storeu_ps(out.add((c0 + j) * plane + p0), column);
                    }
                }
            }
            // the rest element by element: the tail pixels of the whole channel blocks,
            // then every pixel of the last channels
            let element = |p: usize, c: usize| {
                let mut v = *sums.add(p * lanes + c);
                if !bias.is_null() {
                    v += *bias.add(c);
                }
                *out.add(c * plane + p) = activate::<ACT>(v);
            };
            for c in 0..whole_channels {
                for p in whole_pixels..pixels {
                    element(p, c);
                }
            }
            for c in whole_channels..channels {
                for p in 0..pixels {
                    element(p, c);
                }
            }
        }
    }

    /// The 8×8 transpose of `rows`: column `j` of the result holds lane `j` of each row.
    #[target_feature(enable = "avx2")]
    fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
        let t0 = _mm256_unpacklo_ps(r[0], r[1]);
        let t1 = _mm256_unpackhi_ps(r[0], r[1]);
        let t2 = _mm256_unpacklo_ps(r[2], r[3]);
        let t3 = _mm256_unpackhi_ps(r[2], r[3]);
        let t4 = _mm256_unpacklo_ps(r[4], r[5]);
        let t5 = _mm256_unpackhi_ps(r[4], r[5]);
        let t6 = _mm256_unpacklo_ps(r[6], r[7]);
        let t7 = _mm256_unpackhi_ps(r[6], r[7]);
        let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
        let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
        let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
        let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
        let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
        let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
        let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
        let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
        [
            _mm256_permute2f128_ps::<0x20>(u0, u4),
            _mm256_permute2f128_ps::<0x20>(u1, u5),
            _mm256_permute2f128_ps::<0x20>(u2, u6),
            _mm256_permute2f128_ps::<0x20>(u3, u7),
            _mm256_permute2f128_ps::<0x31>(u0, u4),
            _mm256_permute2f128_ps::<0x31>(u1, u5),
            _mm256_permute2f128_ps::<0x31>(u2, u6),
            _mm256_permute2f128_ps::<0x31>(u3, u7),
        ]
    }
}
