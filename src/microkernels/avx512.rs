//! The AVX-512F conv tile: 16 output channels as one zmm vector, 28 pixels per register block.
//!
//! 28 accumulators plus the weight vector of the current input channel (29 of the 32 zmm
//! registers); x is broadcast from memory by the FMA itself (`{1to16}`). Per input channel a
//! block does 1 weight load and 28 FMAs: FMA-bound on two FMA-512 ports, with far more
//! independent chains than the FMA latency needs. The block is this wide because every block
//! streams the whole weight slice (`rows·taps·chans` × 64 bytes, often more than L1 holds)
//! once: a 3×3 conv row of 28 pixels at 128 channels measured 130 GFLOP/s with 14-pixel
//! blocks and 160 with 28. The remainder (1–27 pixels) is one block.

use std::arch::x86_64::*;

use super::{empty_reduction, Geom};

/// Pixels per full register block.
const BLOCK: usize = 28;
/// Input channels ahead that planar blocks prefetch.
const PREFETCH_DISTANCE: isize = 8;
/// Input channels ahead whose weight row (one cache line) every block prefetches: cold
/// weights stream from memory, and the hardware prefetchers stop at each 4 KiB page.
/// ResNet-50, per-op minima of 4 alternating runs: 77.9 → 67.6 ms.
const W_PREFETCH_DISTANCE: isize = 16;

/// The AVX-512F conv tile; the contract is the module docs of [`crate::microkernels`].
///
/// # Safety
///
/// The CPU must support AVX-512F ([`super::has_avx512f`]); every index of the contract
/// must lie inside the buffers `x`, `w` and `out` point to; `out` must not overlap `x` or `w`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub unsafe extern "C" fn conv_tile_avx512(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    pixels: i64,
    rows: i64,
    row_stride: i64,
    taps: i64,
    tap_stride: i64,
    chans: i64,
    chan_stride: i64,
    pixel_stride: i64,
    w_tap_stride: i64,
    out_pixel_stride: i64,
    out_vec_stride: i64,
    accumulate: i64,
) {
    let g = Geom::new(
        w,
        rows,
        row_stride,
        taps,
        tap_stride,
        chans,
        chan_stride,
        pixel_stride,
        w_tap_stride,
        out_pixel_stride,
        out_vec_stride,
        accumulate,
    );
    let pixels = pixels as isize;
    if pixels <= 0 {
        return;
    }
    if g.is_empty() {
        // SAFETY: the caller's contract.
        unsafe { empty_reduction(out, pixels, &g) };
        return;
    }
    let full = pixels / BLOCK as isize;
    // SAFETY (all blocks): pixels p..p+n are pixels of the call and the reduction is
    // non-empty, so x + p*pixel_stride and out + p*out_pixel_stride are contract indices.
    unsafe {
        // Common pixel strides are compile-time constants in the full blocks, so every
        // pixel's x address is the base plus an immediate: with a run-time stride the
        // addresses take integer adds that compete with the FMAs for ports. Planar inputs
        // (a channel at least a cache line from the next) are prefetched.
        match (g.pixel_stride, g.chan_stride >= 16) {
            (1, true) => full_blocks::<1, true>(&g, x, out, full),
            (2, true) => full_blocks::<2, true>(&g, x, out, full),
            (1, false) => full_blocks::<1, false>(&g, x, out, full),
            (2, false) => full_blocks::<2, false>(&g, x, out, full),
            (3, _) => full_blocks::<3, false>(&g, x, out, full),
            (6, _) => full_blocks::<6, false>(&g, x, out, full),
            (64, _) => full_blocks::<64, false>(&g, x, out, full),
            (128, _) => full_blocks::<128, false>(&g, x, out, full),
            (256, _) => full_blocks::<256, false>(&g, x, out, full),
            (512, _) => full_blocks::<512, false>(&g, x, out, full),
            (1024, _) => full_blocks::<1024, false>(&g, x, out, full),
            _ => full_blocks::<0, false>(&g, x, out, full),
        }
        let p = full * BLOCK as isize;
        if p == pixels {
            return;
        }
        let (xp, op) = (
            x.offset(p * g.pixel_stride),
            out.offset(p * g.out_pixel_stride),
        );
        // The rest as one block, so every chain of a 16-pixel call (Winograd's products
        // at 14² and 7²) overlaps the FMA latency; unit pixel strides (planar inputs)
        // keep their constant addresses and prefetches.
        let planar = g.pixel_stride == 1 && g.chan_stride >= 16;
        macro_rules! rest {
            ($($n:literal)*) => {
                match pixels - p {
                    $($n if planar => block::<$n, 1, true>(&g, xp, op),
                      $n if g.pixel_stride == 1 => block::<$n, 1, false>(&g, xp, op),
                      $n => block::<$n, 0, false>(&g, xp, op),)*
                    _ => {}
                }
            };
        }
        rest!(1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27);
    }
}

/// The first `full` blocks of `BLOCK` pixels (see [`block`] for `PS` and `PF`).
///
/// # Safety
///
/// As [`block`], for all `full * BLOCK` pixels.
#[target_feature(enable = "avx512f")]
unsafe fn full_blocks<const PS: usize, const PF: bool>(
    g: &Geom,
    x: *const f32,
    out: *mut f32,
    full: isize,
) {
    for b in 0..full {
        let p = b * BLOCK as isize;
        // SAFETY: the caller's.
        unsafe {
            block::<BLOCK, PS, PF>(
                g,
                x.offset(p * g.pixel_stride),
                out.offset(p * g.out_pixel_stride),
            )
        };
    }
}

/// `NP` pixels starting at `x` (their r=t=c=0 input) and `out` (their lane-0 output), with
/// pixel stride `PS` if it is not 0 (then it equals `g.pixel_stride`); with `PF` (only for
/// `PS` 1 or 2), the x lines of channel `c + PREFETCH_DISTANCE` are prefetched while channel
/// `c` is computed, as long as that channel exists (so only contract addresses are touched).
///
/// # Safety
///
/// AVX-512F; a non-empty reduction; the contract's indices for these `NP` pixels in bounds.
#[target_feature(enable = "avx512f")]
unsafe fn block<const NP: usize, const PS: usize, const PF: bool>(
    g: &Geom,
    x: *const f32,
    out: *mut f32,
) {
    let ps = if PS == 0 { g.pixel_stride } else { PS as isize };
    let ovs = g.out_vec_stride;
    let mut acc = [_mm512_setzero_ps(); NP];
    // SAFETY (whole body): every pointer dereferenced or prefetched is a contract index:
    // out groups p*out_pixel_stride + {0,1,2,3}*out_vec_stride (4 floats each), weight rows
    // (r*taps+t)*w_tap_stride + c*16 (16 floats), single x floats of channels c < chans.
    unsafe {
        if g.accumulate {
            for (p, a) in acc.iter_mut().enumerate() {
                let o = out.offset(p as isize * g.out_pixel_stride);
                *a = if ovs == 4 {
                    _mm512_loadu_ps(o)
                } else {
                    let v = _mm512_castps128_ps512(_mm_loadu_ps(o));
                    let v = _mm512_insertf32x4::<1>(v, _mm_loadu_ps(o.offset(ovs)));
                    let v = _mm512_insertf32x4::<2>(v, _mm_loadu_ps(o.offset(2 * ovs)));
                    _mm512_insertf32x4::<3>(v, _mm_loadu_ps(o.offset(3 * ovs)))
                };
            }
        }
        for r in 0..g.rows {
            for t in 0..g.taps {
                let xrt = x.offset(r * g.row_stride + t * g.tap_stride);
                let wrt = g.w.offset((r * g.taps + t) * g.w_tap_stride);
                // one loop (a second loop for the last channels without prefetches
                // makes LLVM keep the accumulators in memory)
                for c in 0..g.chans {
                    if PF && c + PREFETCH_DISTANCE < g.chans {
                        prefetch_pixels::<NP, PS>(
                            xrt.offset((c + PREFETCH_DISTANCE) * g.chan_stride),
                        );
                    }
                    if c + W_PREFETCH_DISTANCE < g.chans {
                        _mm_prefetch::<_MM_HINT_T0>(
                            wrt.offset((c + W_PREFETCH_DISTANCE) * 16) as *const i8
                        );
                    }
                    channel(
                        &mut acc,
                        xrt.offset(c * g.chan_stride),
                        wrt.offset(c * 16),
                        ps,
                    );
                }
            }
        }
        for (p, a) in acc.iter().enumerate() {
            let o = out.offset(p as isize * g.out_pixel_stride);
            if ovs == 4 {
                _mm512_storeu_ps(o, *a);
            } else {
                _mm_storeu_ps(o, _mm512_extractf32x4_ps::<0>(*a));
                _mm_storeu_ps(o.offset(ovs), _mm512_extractf32x4_ps::<1>(*a));
                _mm_storeu_ps(o.offset(2 * ovs), _mm512_extractf32x4_ps::<2>(*a));
                _mm_storeu_ps(o.offset(3 * ovs), _mm512_extractf32x4_ps::<3>(*a));
            }
        }
    }
}

/// One input channel: `acc[p] += x[p*ps] * w[0..16]` for every pixel of the block.
///
/// # Safety
///
/// AVX-512F; `x[p*ps]` for `p < NP` and `w[0..16]` readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn channel<const NP: usize>(
    acc: &mut [__m512; NP],
    x: *const f32,
    w: *const f32,
    ps: isize,
) {
    // SAFETY: the caller's.
    unsafe {
        let wv = _mm512_loadu_ps(w);
        for (p, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(_mm512_set1_ps(*x.offset(p as isize * ps)), wv, *a);
        }
    }
}

/// Prefetches the cache lines of pixels `0..NP` at stride `PS` (1 or 2) from `x`: one pixel
/// per 16 floats and the last, so every line of the span is touched.
///
/// # Safety
///
/// `x[p*PS]` for `p < NP` must be contract indices (prefetches cannot fault, but the
/// contract allows no other addresses).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn prefetch_pixels<const NP: usize, const PS: usize>(x: *const f32) {
    let step = 16 / PS.max(1);
    let mut p = 0;
    while p < NP {
        _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add(p * PS) as *const i8);
        p += step;
    }
    _mm_prefetch::<_MM_HINT_T0>(x.wrapping_add((NP - 1) * PS) as *const i8);
}
