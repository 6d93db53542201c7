//! The AVX2+FMA conv tile: 16 output channels as two ymm vectors, 6 pixels per register block.
//!
//! 6 pixels × 2 vectors = 12 accumulators, plus the two weight vectors of the current input
//! channel and one broadcast x: 15 of the 16 ymm registers. Per input channel a block does
//! 2 weight loads, 6 broadcasts and 12 FMAs, so it is FMA-bound (two FMA ports) and the 12
//! independent chains cover the FMA latency. Remainder pixels (1–5) use the same code
//! monomorphized for the smaller block.

use std::arch::x86_64::*;

use smelt_ir::loops::StoreActivation;

use super::store::{activate8, with_activation, HARDSWISH, NO_FINISH, RELU};
use super::{empty_reduction, for_each_channel, ConvTile, Geom, LANES};

/// Pixels per full register block.
const BLOCK: usize = 6;
/// Input channels ahead that planar blocks prefetch.
const PREFETCH_DISTANCE: isize = 16;
/// Input channels ahead whose weight row (one cache line) every block prefetches: cold
/// weights stream from memory, and the hardware prefetchers stop at each 4 KiB page.
/// About 200 cycles ahead at 12 FMAs per channel (the AVX-512 kernel: 16 channels).
const W_PREFETCH_DISTANCE: isize = 32;

/// The AVX2+FMA conv tile; the contract is the module docs of [`crate::microkernels`].
///
/// # Safety
///
/// The CPU must support AVX2 and FMA ([`super::has_avx2_fma`]); every index of the contract
/// must lie inside the buffers `x`, `w` and `out` point to (and, with a finish, `bias` and
/// `residual` unless null); `out` must not overlap `x`, `w` or `bias`.
#[target_feature(enable = "avx2,fma")]
pub unsafe extern "C" fn conv_tile_avx2(
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
    let pixels = pixels as isize;
    if pixels <= 0 {
        return;
    }
    if g.is_empty() {
        // SAFETY: the caller's contract.
        unsafe { empty_reduction(out, pixels, &g, LANES as isize) };
        return;
    }
    let full = pixels / BLOCK as isize;
    // SAFETY: for all blocks, pixels p..p+n are pixels of the call and the reduction is
    // non-empty, so x + p*pixel_stride and out + p*out_pixel_stride are contract indices.
    unsafe {
        match g.finish {
            None => all_full_blocks::<NO_FINISH>(&g, x, out, full),
            Some(act) => with_activation!(act, FIN => all_full_blocks::<FIN>(&g, x, out, full)),
        }
        let p = full * BLOCK as isize;
        if p == pixels {
            return;
        }
        let (xp, op) = (
            x.offset(p * g.pixel_stride),
            out.offset(p * g.out_pixel_stride),
        );
        match pixels - p {
            1 => block::<1, 0, false, NO_FINISH>(&g, xp, op),
            2 => block::<2, 0, false, NO_FINISH>(&g, xp, op),
            3 => block::<3, 0, false, NO_FINISH>(&g, xp, op),
            4 => block::<4, 0, false, NO_FINISH>(&g, xp, op),
            5 => block::<5, 0, false, NO_FINISH>(&g, xp, op),
            _ => {}
        }
        // the remainder's finish, over its stored sums (one block: still in L1)
        finish_run(&g, op, pixels - p);
    }
}

/// The `full` blocks of a call, each finished with `FIN` (see [`block`]).
///
/// # Safety
///
/// As [`full_blocks`], with the finish's operands when `FIN` is one.
#[target_feature(enable = "avx2,fma")]
unsafe fn all_full_blocks<const FIN: u8>(g: &Geom, x: *const f32, out: *mut f32, full: isize) {
    // SAFETY: the caller's.
    unsafe {
        // Common pixel strides are compile-time constants in the full blocks, so every
        // pixel's x address is the base plus an immediate: with a run-time stride the
        // addresses take integer adds that compete with the FMAs for ports (a GEMM's
        // rows are K apart: the transformers' K of 384 to 3072 are listed too). Planar
        // inputs (a channel at least a cache line from the next) are prefetched.
        match (g.pixel_stride, g.chan_stride >= 16) {
            (1, true) => full_blocks::<1, true, FIN>(g, x, out, full),
            (2, true) => full_blocks::<2, true, FIN>(g, x, out, full),
            (1, false) => full_blocks::<1, false, FIN>(g, x, out, full),
            (2, false) => full_blocks::<2, false, FIN>(g, x, out, full),
            (3, _) => full_blocks::<3, false, FIN>(g, x, out, full),
            (6, _) => full_blocks::<6, false, FIN>(g, x, out, full),
            (16, _) => full_blocks::<16, false, FIN>(g, x, out, full),
            (64, _) => full_blocks::<64, false, FIN>(g, x, out, full),
            (128, _) => full_blocks::<128, false, FIN>(g, x, out, full),
            (256, _) => full_blocks::<256, false, FIN>(g, x, out, full),
            (512, _) => full_blocks::<512, false, FIN>(g, x, out, full),
            (1024, _) => full_blocks::<1024, false, FIN>(g, x, out, full),
            (384, _) => full_blocks::<384, false, FIN>(g, x, out, full),
            (768, _) => full_blocks::<768, false, FIN>(g, x, out, full),
            (1536, _) => full_blocks::<1536, false, FIN>(g, x, out, full),
            (3072, _) => full_blocks::<3072, false, FIN>(g, x, out, full),
            _ => full_blocks::<0, false, FIN>(g, x, out, full),
        }
    }
}

/// The contract's finish over `pixels` pixels of stored sums from `out` (16 lanes each),
/// in place: a call's remainder block. Nothing without a finish.
///
/// # Safety
///
/// As [`block`] for these pixels (their sums stored), with the finish's operands.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn finish_run(g: &Geom, out: *mut f32, pixels: isize) {
    let Some(act) = g.finish else {
        return;
    };
    // SAFETY: bias lanes 0..16 and the residual and out runs of 16 at the contract's out
    // indices of these pixels.
    unsafe {
        let residual = g.residual_at(out);
        for p in 0..pixels {
            for j in 0..2 {
                let at = p * g.out_pixel_stride + 8 * j;
                let mut x = _mm256_loadu_ps(out.offset(at));
                if !g.bias.is_null() {
                    x = _mm256_add_ps(x, _mm256_loadu_ps(g.bias.offset(8 * j)));
                }
                if !residual.is_null() {
                    x = _mm256_add_ps(x, _mm256_loadu_ps(residual.offset(at)));
                }
                let y = match act {
                    StoreActivation::Identity => x,
                    StoreActivation::Relu => activate8::<RELU>(x),
                    StoreActivation::HardSwish => activate8::<HARDSWISH>(x),
                };
                _mm256_storeu_ps(out.offset(at), y);
            }
        }
    }
}

/// The first `full` blocks of `BLOCK` pixels (see [`block`] for `PS` and `PF`).
///
/// # Safety
///
/// As [`block`], for all `full * BLOCK` pixels.
#[target_feature(enable = "avx2,fma")]
unsafe fn full_blocks<const PS: usize, const PF: bool, const FIN: u8>(
    g: &Geom,
    x: *const f32,
    out: *mut f32,
    full: isize,
) {
    for b in 0..full {
        let p = b * BLOCK as isize;
        // SAFETY: the caller's.
        unsafe {
            block::<BLOCK, PS, PF, FIN>(
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
/// AVX2+FMA; a non-empty reduction; the contract's indices for these `NP` pixels in bounds.
#[target_feature(enable = "avx2,fma")]
unsafe fn block<const NP: usize, const PS: usize, const PF: bool, const FIN: u8>(
    g: &Geom,
    x: *const f32,
    out: *mut f32,
) {
    let ps = if PS == 0 { g.pixel_stride } else { PS as isize };
    let ovs = g.out_vec_stride;
    let mut acc = [[_mm256_setzero_ps(); 2]; NP];
    // SAFETY: for the whole body, every pointer dereferenced or prefetched is a contract index:
    // out groups p*out_pixel_stride + {0,1,2,3}*out_vec_stride (4 floats each), weight rows
    // (r*taps+t)*w_tap_stride + c*16 (16 floats), single x floats of channels c < chans.
    unsafe {
        if g.accumulate {
            for (p, a) in acc.iter_mut().enumerate() {
                let o = out.offset(p as isize * g.out_pixel_stride);
                a[0] = _mm256_loadu2_m128(o.offset(ovs), o);
                a[1] = _mm256_loadu2_m128(o.offset(3 * ovs), o.offset(2 * ovs));
            }
        }
        for_each_channel::<NP, PS, PF, PREFETCH_DISTANCE, W_PREFETCH_DISTANCE>(
            g,
            x,
            16,
            |xc, wc| channel(&mut acc, xc, wc, ps),
        );
        // the contract's finish (out_vec_stride is 4) in registers, the activation a
        // constant: a block without one is exactly the code it was before finishes
        if FIN != NO_FINISH {
            return finish_store::<NP, FIN>(g, &acc, out);
        }
        for (p, a) in acc.iter().enumerate() {
            let o = out.offset(p as isize * g.out_pixel_stride);
            if ovs == 4 {
                _mm256_storeu_ps(o, a[0]);
                _mm256_storeu_ps(o.add(8), a[1]);
            } else {
                _mm256_storeu2_m128(o.offset(ovs), o, a[0]);
                _mm256_storeu2_m128(o.offset(3 * ovs), o.offset(2 * ovs), a[1]);
            }
        }
    }
}

/// Stores a block's sums finished with activation `ACT` (the contract's finish), as the
/// store routines compute it: the same bits.
///
/// # Safety
///
/// As [`block`], with a finish: `out_vec_stride` is 4, and the bias lanes and the
/// residual at the out indices (when not null) readable.
#[inline(always)]
unsafe fn finish_store<const NP: usize, const ACT: u8>(
    g: &Geom,
    acc: &[[__m256; 2]; NP],
    out: *mut f32,
) {
    // SAFETY: bias lanes 0..16 and, for each pixel, the residual and out runs of 16 at
    // the contract's out index.
    unsafe {
        let residual = g.residual_at(out);
        let bias = if g.bias.is_null() {
            [_mm256_setzero_ps(); 2]
        } else {
            [_mm256_loadu_ps(g.bias), _mm256_loadu_ps(g.bias.add(8))]
        };
        for (p, a) in acc.iter().enumerate() {
            for (j, &sum) in a.iter().enumerate() {
                let at = p as isize * g.out_pixel_stride + 8 * j as isize;
                let mut v = sum;
                if !g.bias.is_null() {
                    v = _mm256_add_ps(v, bias[j]);
                }
                if !residual.is_null() {
                    v = _mm256_add_ps(v, _mm256_loadu_ps(residual.offset(at)));
                }
                _mm256_storeu_ps(out.offset(at), activate8::<ACT>(v));
            }
        }
    }
}

/// One input channel: `acc[p] += x[p*ps] * w[0..16]` for every pixel of the block.
///
/// # Safety
///
/// AVX2+FMA; `x[p*ps]` for `p < NP` and `w[0..16]` readable.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn channel<const NP: usize>(
    acc: &mut [[__m256; 2]; NP],
    x: *const f32,
    w: *const f32,
    ps: isize,
) {
    // SAFETY: the caller's.
    unsafe {
        let w0 = _mm256_loadu_ps(w);
        let w1 = _mm256_loadu_ps(w.add(8));
        for (p, a) in acc.iter_mut().enumerate() {
            let xv = _mm256_broadcast_ss(&*x.offset(p as isize * ps));
            a[0] = _mm256_fmadd_ps(xv, w0, a[0]);
            a[1] = _mm256_fmadd_ps(xv, w1, a[1]);
        }
    }
}
