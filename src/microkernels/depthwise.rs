//! Depthwise-row routines: one output row of one channel of a depthwise convolution,
//! `k×k` taps summed on AVX-512F (16 columns per vector) or AVX2 + FMA (8), called by JIT
//! code, which applies the bias and the fused epilogue afterwards.
//!
//! # The contract (the safety argument)
//!
//! Every routine has the C signature of [`DepthwiseRowFn`], `(x, w, out, shape)`: three
//! buffer pointers and the call's [`DepthwiseRow`] record, read once at entry. For
//! `q < cols`:
//!
//! ```text
//! out[q] = Σ_{r<rows} Σ_{t<taps} x[r·row_stride + tap_offsets[t] + q] · w[r·taps + t]
//! ```
//!
//! summed from zero in `r, t` order with fused multiply-adds, the same order for every
//! column and every routine, so each gives the same bits as [`depthwise_row_reference`].
//! The caller proves every index above inside its buffer (`DepthwiseRow::footprints`);
//! the routines read and write only those indices: a partial last vector is loaded and
//! stored under a mask, whose masked-off lanes are neither read nor written (and cannot
//! fault). Counts, strides and offsets are `i64` in elements, non-negative, and `taps` is
//! at most [`DEPTHWISE_MAX_TAPS`]; a record breaking that is treated as empty (nothing is
//! touched). Loads are unaligned: no alignment is required.
//!
//! # Speed
//!
//! A call runs its columns in blocks of up to 8 vectors (128 columns with AVX-512), one
//! accumulator each: per tap, one weight broadcast, then a load and an FMA per vector.
//! Eight chains cover the FMA latency on two pipes; a row of 80 columns is one block of
//! 5. The x rows of one output row are a few KiB, so every load hits L1.

#![allow(unsafe_code)]

use smelt_ir::loops::{DepthwiseRow, DEPTHWISE_MAX_TAPS};

/// The C-ABI type of every depthwise-row routine (see the module docs for the contract).
pub type DepthwiseRowFn =
    unsafe extern "C" fn(x: *const f32, w: *const f32, out: *mut f32, shape: *const DepthwiseRow);

/// The routine's view of a record: counts as `usize`, or `None` for a record the
/// contract calls empty (negative values, too many taps).
struct Shape {
    cols: usize,
    rows: usize,
    row_stride: usize,
    taps: usize,
    offsets: [usize; DEPTHWISE_MAX_TAPS],
}

impl Shape {
    fn of(s: &DepthwiseRow) -> Option<Shape> {
        let count = |v: i64| usize::try_from(v).ok();
        let taps = count(s.taps).filter(|&t| t <= DEPTHWISE_MAX_TAPS)?;
        let mut offsets = [0usize; DEPTHWISE_MAX_TAPS];
        for (d, &o) in offsets.iter_mut().zip(&s.tap_offsets).take(taps) {
            *d = count(o)?;
        }
        Some(Shape {
            cols: count(s.cols)?,
            rows: count(s.rows)?,
            row_stride: count(s.row_stride)?,
            taps,
            offsets,
        })
    }
}

/// The oracle: the contract computed one column at a time with `f32::mul_add`.
///
/// # Safety
///
/// Every index of the contract must lie inside the buffers behind `x`, `w` and `out`,
/// and `shape` must point to a valid record.
pub unsafe extern "C" fn depthwise_row_reference(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    shape: *const DepthwiseRow,
) {
    // SAFETY: the caller passes a valid record.
    let Some(s) = Shape::of(unsafe { &*shape }) else {
        return;
    };
    for q in 0..s.cols {
        let mut acc = 0.0f32;
        for r in 0..s.rows {
            for t in 0..s.taps {
                // SAFETY: indices of the contract, which the caller proved in bounds.
                let (xv, wv) = unsafe {
                    (
                        *x.add(r * s.row_stride + s.offsets[t] + q),
                        *w.add(r * s.taps + t),
                    )
                };
                acc = xv.mul_add(wv, acc);
            }
        }
        // SAFETY: `q < cols`, inside `out` by the contract.
        unsafe { *out.add(q) = acc };
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{depthwise_row_avx2, depthwise_row_avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{DepthwiseRow, Shape};

    /// Vectors per full block: 8 accumulators keep two FMA pipes of latency 4 busy.
    const BLOCK: usize = 8;

    /// Runs `block::<N>` over `s.cols` columns of `lanes` per vector: full blocks of
    /// [`BLOCK`] vectors, then one block of the rest, its last vector partial.
    macro_rules! blocks {
        ($lanes:expr, $block:ident, $s:expr, $x:expr, $w:expr, $out:expr) => {{
            let (s, lanes) = ($s, $lanes);
            let mut q = 0;
            while s.cols - q >= BLOCK * lanes {
                // SAFETY: columns `q..q + BLOCK·lanes` are inside the contract's range.
                unsafe { $block::<BLOCK>(&s, $x, $w, $out, q, BLOCK * lanes) };
                q += BLOCK * lanes;
            }
            let rest = s.cols - q;
            // SAFETY: columns `q..cols`, the last vector masked to `rest % lanes`.
            unsafe {
                match rest.div_ceil(lanes) {
                    1 => $block::<1>(&s, $x, $w, $out, q, rest),
                    2 => $block::<2>(&s, $x, $w, $out, q, rest),
                    3 => $block::<3>(&s, $x, $w, $out, q, rest),
                    4 => $block::<4>(&s, $x, $w, $out, q, rest),
                    5 => $block::<5>(&s, $x, $w, $out, q, rest),
                    6 => $block::<6>(&s, $x, $w, $out, q, rest),
                    7 => $block::<7>(&s, $x, $w, $out, q, rest),
                    8 => $block::<8>(&s, $x, $w, $out, q, rest),
                    _ => {}
                }
            }
        }};
    }

    /// The AVX-512F routine: 16 columns per vector.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX-512F; every index of the contract (module docs of
    /// [`super`]) must lie inside the buffers, and `shape` must point to a valid record.
    #[target_feature(enable = "avx512f")]
    pub unsafe extern "C" fn depthwise_row_avx512(
        x: *const f32,
        w: *const f32,
        out: *mut f32,
        shape: *const DepthwiseRow,
    ) {
        // SAFETY: the caller passes a valid record.
        if let Some(s) = Shape::of(unsafe { &*shape }) {
            blocks!(16, block512, s, x, w, out);
        }
    }

    /// `N` vectors of 16 columns from column `q`; `count` columns in all (the last
    /// vector masked when it is partial).
    #[target_feature(enable = "avx512f")]
    unsafe fn block512<const N: usize>(
        s: &Shape,
        x: *const f32,
        w: *const f32,
        out: *mut f32,
        q: usize,
        count: usize,
    ) {
        let last = count - (N - 1) * 16;
        let mask: __mmask16 = if last >= 16 {
            0xFFFF
        } else {
            (1u16 << last) - 1
        };
        let mut acc = [_mm512_setzero_ps(); N];
        for r in 0..s.rows {
            for t in 0..s.taps {
                // SAFETY: the contract's indices: weight `r·taps + t`, and the run of
                // `count` inputs from `r·row_stride + offset + q` (the masked-off lanes
                // of the last vector are not read).
                unsafe {
                    let wv = _mm512_set1_ps(*w.add(r * s.taps + t));
                    let xr = x.add(r * s.row_stride + s.offsets[t] + q);
                    for (j, a) in acc.iter_mut().enumerate() {
                        let v = if j + 1 < N {
                            _mm512_loadu_ps(xr.add(16 * j))
                        } else {
                            _mm512_maskz_loadu_ps(mask, xr.add(16 * j))
                        };
                        *a = _mm512_fmadd_ps(v, wv, *a);
                    }
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: columns `q..q + count` of `out`, the last vector masked.
            unsafe {
                if j + 1 < N {
                    _mm512_storeu_ps(out.add(q + 16 * j), *a);
                } else {
                    _mm512_mask_storeu_ps(out.add(q + 16 * j), mask, *a);
                }
            }
        }
    }

    /// The AVX2 + FMA routine: 8 columns per vector.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA; every index of the contract (module docs of
    /// [`super`]) must lie inside the buffers, and `shape` must point to a valid record.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe extern "C" fn depthwise_row_avx2(
        x: *const f32,
        w: *const f32,
        out: *mut f32,
        shape: *const DepthwiseRow,
    ) {
        // SAFETY: the caller passes a valid record.
        if let Some(s) = Shape::of(unsafe { &*shape }) {
            blocks!(8, block256, s, x, w, out);
        }
    }

    /// `N` vectors of 8 columns from column `q`; `count` columns in all (the last vector
    /// masked when it is partial: `vmaskmovps` neither reads nor writes masked-off lanes).
    #[target_feature(enable = "avx2,fma")]
    unsafe fn block256<const N: usize>(
        s: &Shape,
        x: *const f32,
        w: *const f32,
        out: *mut f32,
        q: usize,
        count: usize,
    ) {
        let last = (count - (N - 1) * 8) as i32;
        let mask = _mm256_cmpgt_epi32(
            _mm256_set1_epi32(last),
            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        );
        let mut acc = [_mm256_setzero_ps(); N];
        for r in 0..s.rows {
            for t in 0..s.taps {
                // SAFETY: as in `block512`.
                unsafe {
                    let wv = _mm256_set1_ps(*w.add(r * s.taps + t));
                    let xr = x.add(r * s.row_stride + s.offsets[t] + q);
                    for (j, a) in acc.iter_mut().enumerate() {
                        let v = if j + 1 < N {
                            _mm256_loadu_ps(xr.add(8 * j))
                        } else {
                            _mm256_maskload_ps(xr.add(8 * j), mask)
                        };
                        *a = _mm256_fmadd_ps(v, wv, *a);
                    }
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: columns `q..q + count` of `out`, the last vector masked.
            unsafe {
                if j + 1 < N {
                    _mm256_storeu_ps(out.add(q + 8 * j), *a);
                } else {
                    _mm256_maskstore_ps(out.add(q + 8 * j), mask, *a);
                }
            }
        }
    }
}
