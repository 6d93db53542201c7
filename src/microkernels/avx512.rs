//! The AVX-512F conv tiles: 16 output channels as one zmm vector with 28 pixels per register
//! block, and 32 output channels as two zmm vectors with 14 pixels per block.
//!
//! 16 channels: 28 accumulators plus the weight vector of the current input channel (29 of
//! the 32 zmm registers); x is broadcast from memory by the FMA itself (`{1to16}`). Per input
//! channel a block does 1 weight load and 28 FMAs: FMA-bound on two FMA-512 ports, with far
//! more independent chains than the FMA latency needs. The block is this wide because every
//! block streams the whole weight slice (`rows·taps·chans` × 64 bytes, often more than L1
//! holds) once: a 3×3 conv row of 28 pixels at 128 channels measured 130 GFLOP/s with
//! 14-pixel blocks and 160 with 28.
//!
//! 32 channels: 14 pixels × 2 vectors = 28 accumulators, the two weight vectors and the
//! broadcast x (LLVM alternates two: all 32 registers, no spills). Per input channel a block does 2 weight loads and 14
//! broadcasts for 28 FMAs (16 loads instead of 29), and every x element read feeds 32
//! channels instead of 16, which halves the activation reads of planar (NCHW) inputs.
//! Standalone, best of 3 alternating runs: the 3×3 channels-last row above 168 → 175
//! GFLOP/s (16 → 32 lanes), a 1×1 NCHW row of 56 pixels at 256 channels 138 → 153; 12-pixel
//! blocks measured 166 and 151.
//!
//! Both share one generic register block (`V` vectors per pixel); the remainder of a call
//! (1–27 or 1–13 pixels) is one block.

use std::arch::x86_64::*;

use smelt_ir::loops::StoreActivation;

use super::store::{activate16, with_activation, HARDSWISH, NO_FINISH, RELU};
use super::{empty_reduction, for_each_channel, ConvTile, Geom};

/// Pixels per full register block, 16 channels.
const BLOCK: usize = 28;
/// Pixels per full register block, 32 channels.
const BLOCK_X32: usize = 14;
/// Input channels ahead that planar blocks prefetch.
const PREFETCH_DISTANCE: isize = 8;
/// Input channels ahead whose weight row (one cache line per vector) every block prefetches:
/// cold weights stream from memory, and the hardware prefetchers stop at each 4 KiB page.
/// ResNet-50 (16 channels), per-op minima of 4 alternating runs: 77.9 → 67.6 ms.
const W_PREFETCH_DISTANCE: isize = 16;

/// The remainder of a call (`$n` pixels from `$x`, `$out`) as one block, monomorphized for
/// each count in the list, so every chain of a short call (Winograd's products at 14² and
/// 7²) overlaps the FMA latency; unit pixel strides (planar inputs) keep their constant
/// addresses and prefetches.
macro_rules! rest {
    ($v:literal, $g:expr, $x:expr, $out:expr, $n:expr; $($np:literal)*) => {{
        let g: &Geom = $g;
        let planar = g.pixel_stride == 1 && g.chan_stride >= 16;
        match $n {
            $($np if planar => block::<$np, $v, { $np * $v }, 1, true, NO_FINISH>(g, $x, $out),
              $np if g.pixel_stride == 1 => {
                  block::<$np, $v, { $np * $v }, 1, false, NO_FINISH>(g, $x, $out)
              }
              $np => block::<$np, $v, { $np * $v }, 0, false, NO_FINISH>(g, $x, $out),)*
            _ => {}
        }
        // the remainder's finish, over its stored sums (one block: still in L1)
        finish_run(g, $out, $n, $v);
    }};
}

/// The AVX-512F conv tile, 16 channels; the contract is the module docs of
/// [`crate::microkernels`].
///
/// # Safety
///
/// The CPU must support AVX-512F ([`super::has_avx512f`]); every index of the contract
/// must lie inside the buffers `x`, `w` and `out` point to (and, with a finish, `bias` and
/// `residual` unless null); `out` must not overlap `x`, `w` or `bias`.
#[target_feature(enable = "avx512f")]
pub unsafe extern "C" fn conv_tile_avx512(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    shape: *const ConvTile,
    next: *const f32,
    bias: *const f32,
    residual: *const f32,
) {
    // SAFETY: readable per the contract.
    let shape = unsafe { &*shape };
    let g = Geom::new(w, shape, next, out, bias, residual);
    let pixels = shape.pixels;
    // SAFETY: the caller's contract; the remainder's pixels are pixels of the call.
    unsafe {
        let pixels = pixels as isize;
        let rest = match g.finish {
            None => full_blocks_of::<1, BLOCK, BLOCK, NO_FINISH>(&g, x, out, pixels),
            Some(act) => with_activation!(act, FIN => {
                full_blocks_of::<1, BLOCK, BLOCK, FIN>(&g, x, out, pixels)
            }),
        };
        if let Some((n, xp, op)) = rest {
            rest!(1, &g, xp, op, n;
                  1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27);
        }
    }
}

/// The AVX-512F conv tile, 32 channels: the contract of [`crate::microkernels`] with 32
/// lanes (weight rows of 32 floats, out groups `0..8`).
///
/// # Safety
///
/// The CPU must support AVX-512F ([`super::has_avx512f`]); every index of the 32-lane
/// contract must lie inside the buffers `x`, `w` and `out` point to; `out` must not overlap
/// `x` or `w`.
#[target_feature(enable = "avx512f")]
pub unsafe extern "C" fn conv_tile_avx512_x32(
    x: *const f32,
    w: *const f32,
    out: *mut f32,
    shape: *const ConvTile,
    next: *const f32,
    bias: *const f32,
    residual: *const f32,
) {
    // SAFETY: readable per the contract.
    let shape = unsafe { &*shape };
    let g = Geom::new(w, shape, next, out, bias, residual);
    let pixels = shape.pixels;
    // SAFETY: the caller's contract; the remainder's pixels are pixels of the call.
    unsafe {
        const NA: usize = 2 * BLOCK_X32;
        let pixels = pixels as isize;
        let rest = match g.finish {
            None => full_blocks_of::<2, BLOCK_X32, NA, NO_FINISH>(&g, x, out, pixels),
            Some(act) => with_activation!(act, FIN => {
                full_blocks_of::<2, BLOCK_X32, NA, FIN>(&g, x, out, pixels)
            }),
        };
        if let Some((n, xp, op)) = rest {
            rest!(2, &g, xp, op, n; 1 2 3 4 5 6 7 8 9 10 11 12 13);
        }
    }
}

/// Everything of a call with `V` vectors (16·`V` channels) per pixel but the remainder:
/// nothing for no pixels, the initial values for an empty reduction, else the full blocks
/// of `NB` pixels (`NA = NB·V` accumulators). Returns the remainder (pixel count in
/// `1..NB`, its x and out) if any.
///
/// # Safety
///
/// AVX-512F; the contract's indices for `pixels` pixels with 16·`V` lanes in bounds.
#[target_feature(enable = "avx512f")]
unsafe fn full_blocks_of<const V: usize, const NB: usize, const NA: usize, const FIN: u8>(
    g: &Geom,
    x: *const f32,
    out: *mut f32,
    pixels: isize,
) -> Option<(isize, *const f32, *mut f32)> {
    if pixels <= 0 {
        return None;
    }
    if g.is_empty() {
        // SAFETY: the caller's contract.
        unsafe { empty_reduction(out, pixels, g, 16 * V as isize) };
        return None;
    }
    let full = pixels / NB as isize;
    // SAFETY: for all blocks, pixels p..p+n are pixels of the call and the reduction is
    // non-empty, so x + p*pixel_stride and out + p*out_pixel_stride are contract indices.
    unsafe {
        // Common pixel strides are compile-time constants in the full blocks, so every
        // pixel's x address is the base plus an immediate: with a run-time stride the
        // addresses take integer adds that compete with the FMAs for ports (a GEMM's
        // rows are K apart: the transformers' K of 384 to 3072 are listed too — 128 rows
        // by 384 × 1536, 0.93–0.98 → 0.85–0.90 ms). Planar inputs (a channel at least a
        // cache line from the next) are prefetched.
        match (g.pixel_stride, g.chan_stride >= 16) {
            (1, true) => full_blocks::<NB, V, NA, 1, true, FIN>(g, x, out, full),
            (2, true) => full_blocks::<NB, V, NA, 2, true, FIN>(g, x, out, full),
            (1, false) => full_blocks::<NB, V, NA, 1, false, FIN>(g, x, out, full),
            (2, false) => full_blocks::<NB, V, NA, 2, false, FIN>(g, x, out, full),
            (3, _) => full_blocks::<NB, V, NA, 3, false, FIN>(g, x, out, full),
            (6, _) => full_blocks::<NB, V, NA, 6, false, FIN>(g, x, out, full),
            (16, _) => full_blocks::<NB, V, NA, 16, false, FIN>(g, x, out, full),
            (64, _) => full_blocks::<NB, V, NA, 64, false, FIN>(g, x, out, full),
            (128, _) => full_blocks::<NB, V, NA, 128, false, FIN>(g, x, out, full),
            (256, _) => full_blocks::<NB, V, NA, 256, false, FIN>(g, x, out, full),
            (512, _) => full_blocks::<NB, V, NA, 512, false, FIN>(g, x, out, full),
            (1024, _) => full_blocks::<NB, V, NA, 1024, false, FIN>(g, x, out, full),
            (384, _) => full_blocks::<NB, V, NA, 384, false, FIN>(g, x, out, full),
            (768, _) => full_blocks::<NB, V, NA, 768, false, FIN>(g, x, out, full),
            (1536, _) => full_blocks::<NB, V, NA, 1536, false, FIN>(g, x, out, full),
            (3072, _) => full_blocks::<NB, V, NA, 3072, false, FIN>(g, x, out, full),
            _ => full_blocks::<NB, V, NA, 0, false, FIN>(g, x, out, full),
        }
        let p = full * NB as isize;
        (p < pixels).then(|| {
            (
                pixels - p,
                x.offset(p * g.pixel_stride),
                out.offset(p * g.out_pixel_stride),
            )
        })
    }
}

/// The first `full` blocks of `NP` pixels (see [`block`] for `V`, `NA`, `PS` and `PF`).
///
/// # Safety
///
/// As [`block`], for all `full * NP` pixels.
#[target_feature(enable = "avx512f")]
unsafe fn full_blocks<
    const NP: usize,
    const V: usize,
    const NA: usize,
    const PS: usize,
    const PF: bool,
    const FIN: u8,
>(
    g: &Geom,
    x: *const f32,
    out: *mut f32,
    full: isize,
) {
    for b in 0..full {
        let p = b * NP as isize;
        // SAFETY: the caller's.
        unsafe {
            block::<NP, V, NA, PS, PF, FIN>(
                g,
                x.offset(p * g.pixel_stride),
                out.offset(p * g.out_pixel_stride),
            )
        };
    }
}

/// `NP` pixels × `V` vectors (16·`V` channels) starting at `x` (their r=t=c=0 input) and
/// `out` (their lane-0 output), in `NA = NP·V` accumulators (one flat array: LLVM keeps a
/// nested one in memory, storing every accumulator after every FMA), with pixel stride `PS` if it is not 0 (then it equals
/// `g.pixel_stride`); with `PF` (only for `PS` 1 or 2), the x lines of channel
/// `c + PREFETCH_DISTANCE` are prefetched while channel `c` is computed, as long as that
/// channel exists (so only contract addresses are touched).
///
/// # Safety
///
/// AVX-512F; a non-empty reduction; the contract's indices (16·`V` lanes) for these `NP`
/// pixels in bounds.
#[target_feature(enable = "avx512f")]
unsafe fn block<
    const NP: usize,
    const V: usize,
    const NA: usize,
    const PS: usize,
    const PF: bool,
    const FIN: u8,
>(
    g: &Geom,
    x: *const f32,
    out: *mut f32,
) {
    const { assert!(NA == NP * V) };
    let ps = if PS == 0 { g.pixel_stride } else { PS as isize };
    let (ovs, obs) = (g.out_vec_stride, g.out_block_stride);
    // floats per weight row (one input channel)
    let row = 16 * V as isize;
    // acc[p*V + j]: pixel p, lanes 16j..16j+16
    let mut acc = [_mm512_setzero_ps(); NA];
    // SAFETY: for the whole body, every pointer dereferenced or prefetched is a contract index:
    // out groups p*out_pixel_stride + j*out_block_stride + {0..4}*out_vec_stride (j < V,
    // 4 floats each), weight rows
    // (r*taps+t)*w_tap_stride + c*16V (16V floats), single x floats of channels c < chans.
    unsafe {
        if g.accumulate {
            for (i, a) in acc.iter_mut().enumerate() {
                let (p, j) = (i / V, i % V);
                let o = out.offset(p as isize * g.out_pixel_stride + j as isize * obs);
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
        for_each_channel::<NP, PS, PF, PREFETCH_DISTANCE, W_PREFETCH_DISTANCE>(
            g,
            x,
            row,
            |xc, wc| channel::<NP, V, NA>(&mut acc, xc, wc, ps),
        );
        // the contract's finish (out_vec_stride is 4) in registers, the activation a
        // constant: a block without one is exactly the code it was before finishes
        if FIN != NO_FINISH {
            return finish_store::<NP, V, NA, FIN>(g, &acc, out);
        }
        for (i, a) in acc.iter().enumerate() {
            let (p, j) = (i / V, i % V);
            let o = out.offset(p as isize * g.out_pixel_stride + j as isize * obs);
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

/// Stores a block's sums finished with activation `ACT` (the contract's finish): each
/// vector plus its bias, plus its residual, through the activation, as the store
/// routines compute it — the same bits, without the sums' round trip through memory.
///
/// # Safety
///
/// As [`block`], with a finish: `out_vec_stride` is 4, and the bias lanes and the
/// residual at the out indices (when not null) readable.
#[inline(always)]
unsafe fn finish_store<const NP: usize, const V: usize, const NA: usize, const ACT: u8>(
    g: &Geom,
    acc: &[__m512; NA],
    out: *mut f32,
) {
    let (ops, obs) = (g.out_pixel_stride, g.out_block_stride);
    // SAFETY: bias lanes 16j..16j+16 (j < V) and, for each (pixel, vector), the residual
    // and out vectors at the contract's out index.
    unsafe {
        let residual = g.residual_at(out);
        let mut bias = [_mm512_setzero_ps(); V];
        if !g.bias.is_null() {
            for (j, b) in bias.iter_mut().enumerate() {
                *b = _mm512_loadu_ps(g.bias.add(16 * j));
            }
        }
        for p in 0..NP {
            for j in 0..V {
                let at = p as isize * ops + j as isize * obs;
                let mut v = acc[p * V + j];
                if !g.bias.is_null() {
                    v = _mm512_add_ps(v, bias[j]);
                }
                if !residual.is_null() {
                    v = _mm512_add_ps(v, _mm512_loadu_ps(residual.offset(at)));
                }
                _mm512_storeu_ps(out.offset(at), activate16::<ACT>(v));
            }
        }
    }
}

/// The contract's finish over `pixels` pixels of stored sums from `out` (16·`V` lanes
/// each), in place: a call's remainder block, finished after its sums are stored so that
/// the 1–27 remainder shapes need no copy per activation. Nothing without a finish.
///
/// # Safety
///
/// As [`block`] for these pixels (their sums stored), with the finish's operands.
#[inline(never)]
#[target_feature(enable = "avx512f")]
unsafe fn finish_run(g: &Geom, out: *mut f32, pixels: isize, v: usize) {
    let Some(act) = g.finish else {
        return;
    };
    let (ops, obs) = (g.out_pixel_stride, g.out_block_stride);
    // SAFETY: bias lanes 16j..16j+16 (j < v) and the residual and out vectors at the
    // contract's out indices of these pixels.
    unsafe {
        let residual = g.residual_at(out);
        for p in 0..pixels {
            for j in 0..v {
                let at = p * ops + j as isize * obs;
                let mut x = _mm512_loadu_ps(out.offset(at));
                if !g.bias.is_null() {
                    x = _mm512_add_ps(x, _mm512_loadu_ps(g.bias.add(16 * j)));
                }
                if !residual.is_null() {
                    x = _mm512_add_ps(x, _mm512_loadu_ps(residual.offset(at)));
                }
                let y = match act {
                    StoreActivation::Identity => x,
                    StoreActivation::Relu => activate16::<RELU>(x),
                    StoreActivation::HardSwish => activate16::<HARDSWISH>(x),
                };
                _mm512_storeu_ps(out.offset(at), y);
            }
        }
    }
}

/// One input channel: `acc[p*V + j] += x[p*ps] * w[16j..16j+16]` for every pixel `p < NP`
/// of the block (`NA = NP·V`).
///
/// # Safety
///
/// AVX-512F; `x[p*ps]` for `p < NP` and `w[0..16V]` readable.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn channel<const NP: usize, const V: usize, const NA: usize>(
    acc: &mut [__m512; NA],
    x: *const f32,
    w: *const f32,
    ps: isize,
) {
    // SAFETY: the caller's.
    unsafe {
        let mut wv = [_mm512_setzero_ps(); V];
        for (j, v) in wv.iter_mut().enumerate() {
            *v = _mm512_loadu_ps(w.add(16 * j));
        }
        for p in 0..NP {
            let xv = _mm512_set1_ps(*x.offset(p as isize * ps));
            for (j, v) in wv.iter().enumerate() {
                acc[p * V + j] = _mm512_fmadd_ps(xv, *v, acc[p * V + j]);
            }
        }
    }
}
