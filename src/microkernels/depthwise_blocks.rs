//! Blocked-depthwise-row routines: one output row of one channel block of a depthwise
//! convolution on channel blocks of 16 (`nchw16c`), its column padding handled inside (on
//! AVX2 + FMA a block is two 8-lane vectors, on AVX-512F one 16-lane vector). They
//! replace Cranelift kernels that wrote every border tile out on f32x4: MobileNetV3's 5×5
//! depthwise kernels were 2,000–2,500 Cranelift instructions each and half of the
//! model's code generation time, and an f32x4 tap costs twice the loads and FMAs of an
//! f32x8 one.
//!
//! # The contract (the safety argument)
//!
//! Every routine has the C signature of [`BlockedDepthwiseRowFn`], `(x, w, bias, out,
//! shape)`: four buffer pointers (`bias` may be null) and the call's
//! [`BlockedDepthwiseRow`] record, read once at entry. The formula is the record's
//! (`smelt_ir::loops::BlockedDepthwiseRow`): for output pixel `p < pixels`, lane
//! `c < lanes`, the bias plus the taps whose input column `p·stride + t·dil − pad` lies
//! in `0..cols`, summed in kernel-row then tap order with fused multiply-adds, then the
//! record's activation (identity, ReLU, hard-swish: the store routines' operations); lanes
//! `lanes..16` of each output pixel are written 0. The routines read only lanes below
//! `lanes` of columns `0..cols` of each kernel row of `x` (`r·x_row_stride + col·16 +
//! c`), of each row's taps of `w` (`r·w_row_stride + t·16 + c`) and of `bias`, and write
//! only `out[0..pixels·16]`: the caller proves those inside their buffers
//! (`BlockedDepthwiseRow::footprints`): a partial block's halves are loaded as 8 lanes,
//! 4 or none, never past its real lanes. A record the contract does not
//! allow (`BlockedDepthwiseRow::is_valid`) touches nothing. `out` must not overlap the
//! inputs. Loads are unaligned: no alignment is required.
//!
//! # Speed
//!
//! The interior pixels (those whose window lies wholly inside the row) are found once per
//! row, not tested pixel by pixel (each test divides twice: a third of a 3×3 row's time),
//! and go in tiles: on AVX2, 6 pixels (12 accumulators, the tap's two weight vectors and
//! an input vector are 15 of the 16 registers; per tap, 2 weight loads, 12 input loads
//! and 12 FMAs); on AVX-512, a whole block is one vector and a tile 12 pixels (per tap,
//! one weight load and 12 FMAs each reading one pixel's cache line). Each pixel's input
//! is at a fixed offset from the tile's first (immediates for strides 1 and 2). Border
//! pixels go one at a time over their valid taps. A partial block takes the AVX2 routine
//! on AVX-512 hosts too (masked 512-bit loads ran slower). MobileNetV3's 3×3 rows at 112²
//! and 56² (one process, 1 thread): 80 → 56 µs (AVX2) → 42 µs (AVX-512) per 16-channel
//! plane, its 72-channel 56² conv 107 → 60 µs.

#![allow(unsafe_code)]

use smelt_ir::loops::{BlockedDepthwiseRow, StoreActivation};

/// The C-ABI type of every blocked-depthwise-row routine (see the module docs).
pub type BlockedDepthwiseRowFn = unsafe extern "C" fn(
    x: *const f32,
    w: *const f32,
    bias: *const f32,
    out: *mut f32,
    shape: *const BlockedDepthwiseRow,
);

/// Elements of a pixel: one channel block (the record's).
const BLOCK: usize = BlockedDepthwiseRow::BLOCK as usize;

/// The routine's view of a valid record, counts as `usize`.
#[derive(Clone, Copy)]
struct Shape {
    pixels: usize,
    lanes: usize,
    cols: usize,
    stride: usize,
    dil: usize,
    pad: usize,
    taps: usize,
    rows: usize,
    x_row_stride: usize,
    w_row_stride: usize,
    act: StoreActivation,
}

impl Shape {
    /// The record as counts, or `None` for a record the contract calls empty.
    fn of(s: &BlockedDepthwiseRow) -> Option<Shape> {
        if !s.is_valid() {
            return None;
        }
        let act = s.activation()?;
        let [pixels, lanes, cols, stride, dil, pad, taps, rows, x_row_stride, w_row_stride, _] =
            s.words().map(|v| v as usize);
        Some(Shape {
            pixels,
            lanes,
            cols,
            stride,
            dil,
            pad,
            taps,
            rows,
            x_row_stride,
            w_row_stride,
            act,
        })
    }

    /// The taps `[t0, t1)` of pixel `p` whose input column lies in `0..cols` (empty when
    /// none does).
    fn valid_taps(&self, p: usize) -> (usize, usize) {
        let start = p * self.stride;
        // first tap with start + t·dil >= pad
        let t0 = if start >= self.pad {
            0
        } else {
            (self.pad - start).div_ceil(self.dil)
        };
        // first tap with start + t·dil >= pad + cols
        let t1 = (self.pad + self.cols)
            .checked_sub(start)
            .map_or(0, |room| room.div_ceil(self.dil));
        let (t0, t1) = (t0.min(self.taps), t1.min(self.taps));
        (t0, t1.max(t0))
    }

    /// The pixels `lo..hi` whose every tap is valid (`valid_taps(p) == (0, taps)`, with
    /// a tap and a column at all): the row's interior, found once rather than pixel by
    /// pixel (each `valid_taps` divides twice).
    fn interior(&self) -> (usize, usize) {
        let span = (self.taps - 1) * self.dil;
        if self.taps == 0 || self.cols == 0 || self.cols + self.pad <= span {
            return (0, 0);
        }
        // p·stride ≥ pad, and p·stride + span − pad ≤ cols − 1
        let lo = self.pad.div_ceil(self.stride);
        let hi = ((self.cols - 1 + self.pad - span) / self.stride + 1).min(self.pixels);
        (lo.min(hi), hi)
    }

    /// The input column of pixel `p`'s tap `t` (a valid tap: never below zero, and
    /// summed before the padding is taken off, so never below zero on the way).
    #[inline(always)]
    fn col(&self, p: usize, t: usize) -> usize {
        p * self.stride + t * self.dil - self.pad
    }
}

/// The oracle: the contract one element at a time with `f32::mul_add`, in the routines'
/// order.
///
/// # Safety
///
/// Every index of the contract must lie inside the buffers behind `x`, `w`, `bias` (or
/// `bias` null) and `out`, and `shape` must point to a valid record.
pub unsafe extern "C" fn blocked_depthwise_row_reference(
    x: *const f32,
    w: *const f32,
    bias: *const f32,
    out: *mut f32,
    shape: *const BlockedDepthwiseRow,
) {
    // SAFETY: the caller passes a valid record.
    let Some(s) = Shape::of(unsafe { &*shape }) else {
        return;
    };
    for p in 0..s.pixels {
        let (t0, t1) = s.valid_taps(p);
        for c in 0..BLOCK {
            let v = if c < s.lanes {
                // SAFETY: the contract's indices (lane c < lanes of each run).
                unsafe {
                    let mut acc = if bias.is_null() { 0.0 } else { *bias.add(c) };
                    for r in 0..s.rows {
                        for t in t0..t1 {
                            let xv = *x.add(r * s.x_row_stride + s.col(p, t) * BLOCK + c);
                            let wv = *w.add(r * s.w_row_stride + t * BLOCK + c);
                            acc = xv.mul_add(wv, acc);
                        }
                    }
                    super::store::activate_one(s.act, acc)
                }
            } else {
                0.0
            };
            // SAFETY: `out[0..pixels·16]` is the contract's output run.
            unsafe { *out.add(p * BLOCK + c) = v };
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{blocked_depthwise_row_avx2, blocked_depthwise_row_avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::store::{activate16, activate8, with_activation};
    use super::{Shape, BLOCK};
    use smelt_ir::loops::BlockedDepthwiseRow;
    use smelt_ir::loops::StoreActivation;

    /// The walk of a row both routines share: its border pixels one at a time over their
    /// valid taps, its interior (`Shape::interior`, every tap valid) in tiles of `$tile`
    /// pixels and one narrower tile of one of the `$width`s; `$call` runs the tile of
    /// `$n` pixels from pixel `$p` over the taps `$taps`. Each call's pixels and taps are
    /// the contract's, which is what the tiles need.
    macro_rules! walk_row {
        ($s:expr, $tile:expr, |$n:ident, $p:ident, $taps:ident| $call:expr; $($width:literal)*) => {{
            let s: &Shape = $s;
            let full = (0, s.taps);
            let (lo, hi) = s.interior();
            for p in (0..lo).chain(hi..s.pixels) {
                const $n: usize = 1;
                let ($p, $taps) = (p, s.valid_taps(p));
                $call
            }
            let mut p = lo;
            while p + $tile <= hi {
                const $n: usize = $tile;
                let ($p, $taps) = (p, full);
                $call;
                p += $tile;
            }
            match hi - p {
                $($width => {
                    const $n: usize = $width;
                    let ($p, $taps) = (p, full);
                    $call
                })*
                _ => {}
            }
        }};
    }

    /// Pixels per interior tile (see the module docs' register count).
    const TILE: usize = 6;

    /// The AVX2 + FMA routine (the contract is the module docs').
    ///
    /// # Safety
    ///
    /// The CPU must support AVX2 and FMA; every index of the contract must lie inside the
    /// buffers, and `shape` must point to a valid record.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe extern "C" fn blocked_depthwise_row_avx2(
        x: *const f32,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
        shape: *const BlockedDepthwiseRow,
    ) {
        // SAFETY: the caller passes a valid record.
        let Some(s) = Shape::of(unsafe { &*shape }) else {
            return;
        };
        // SAFETY: forwarded contract.
        unsafe { with_activation!(s.act, ACT => lanes_avx2::<ACT>(&s, x, w, bias, out)) }
    }

    /// [`row`] for the record's lanes, activation `ACT`.
    ///
    /// # Safety
    ///
    /// As [`blocked_depthwise_row_avx2`]; `ACT` is the record's activation.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn lanes_avx2<const ACT: u8>(
        s: &Shape,
        x: *const f32,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
    ) {
        // SAFETY: forwarded.
        unsafe {
            match s.lanes {
                16 => row::<FULL, FULL, ACT>(s, x, w, bias, out),
                12 => row::<FULL, QUARTER, ACT>(s, x, w, bias, out),
                8 => row::<FULL, OFF, ACT>(s, x, w, bias, out),
                _ => row::<QUARTER, OFF, ACT>(s, x, w, bias, out),
            }
        }
    }

    /// Pixels per interior tile of the AVX-512 routine: 12 accumulators, one weight
    /// vector; each input load is one whole pixel (a cache line).
    const TILE_512: usize = 12;

    /// The AVX-512F routine (the contract is the module docs'): a whole block (16 lanes)
    /// is one 512-bit vector, so a tap costs one load and one FMA per pixel instead of
    /// two of each; a partial block takes the AVX2 routine (masked loads ran slower).
    /// Each lane's sum is the same chain of fused multiply-adds, so the bits are the AVX2
    /// routine's.
    ///
    /// # Safety
    ///
    /// The CPU must support AVX-512F; every index of the contract must lie inside the
    /// buffers, and `shape` must point to a valid record.
    #[target_feature(enable = "avx512f")]
    pub unsafe extern "C" fn blocked_depthwise_row_avx512(
        x: *const f32,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
        shape: *const BlockedDepthwiseRow,
    ) {
        // SAFETY: the caller passes a valid record.
        let Some(s) = Shape::of(unsafe { &*shape }) else {
            return;
        };
        if s.lanes != 16 {
            // SAFETY: forwarded contract (AVX-512F implies AVX2 and FMA).
            return unsafe { blocked_depthwise_row_avx2(x, w, bias, out, shape) };
        }
        // SAFETY: forwarded contract.
        unsafe { with_activation!(s.act, ACT => strides_512::<ACT>(&s, x, w, bias, out)) }
    }

    /// [`row_512`] for the record's stride, activation `ACT`.
    ///
    /// # Safety
    ///
    /// As [`blocked_depthwise_row_avx512`] with 16 lanes; `ACT` is the record's
    /// activation.
    #[target_feature(enable = "avx512f")]
    unsafe fn strides_512<const ACT: u8>(
        s: &Shape,
        x: *const f32,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
    ) {
        // SAFETY: forwarded.
        unsafe {
            match s.stride {
                1 => row_512::<1, ACT>(s, x, w, bias, out),
                2 => row_512::<2, ACT>(s, x, w, bias, out),
                _ => row_512::<0, ACT>(s, x, w, bias, out),
            }
        }
    }

    /// [`row_strided`] for a whole block on 512-bit vectors.
    ///
    /// # Safety
    ///
    /// As [`blocked_depthwise_row_avx512`] with 16 lanes; `S` is 0 or the stride.
    #[target_feature(enable = "avx512f")]
    unsafe fn row_512<const S: usize, const ACT: u8>(
        s: &Shape,
        x: *const f32,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
    ) {
        let init = if bias.is_null() {
            _mm512_setzero_ps()
        } else {
            // SAFETY: the bias's 16 lanes.
            unsafe { _mm512_loadu_ps(bias) }
        };
        // SAFETY: forwarded (see `walk_row!`).
        unsafe {
            walk_row!(s, TILE_512, |N, p, taps| {
                tile_512::<N, S, ACT>(s, [x, w], init, out, p, taps)
            }; 11 10 9 8 7 6 5 4 3 2 1);
        }
    }

    /// [`tile`] for a whole block on 512-bit vectors.
    ///
    /// # Safety
    ///
    /// As [`row_512`], with `t0..t1` valid taps of every pixel of the tile.
    #[target_feature(enable = "avx512f")]
    unsafe fn tile_512<const P: usize, const S: usize, const ACT: u8>(
        s: &Shape,
        [x, w]: [*const f32; 2],
        init: __m512,
        out: *mut f32,
        p0: usize,
        (t0, t1): (usize, usize),
    ) {
        let mut acc = [init; P];
        let step = if S == 0 { s.stride * BLOCK } else { S * BLOCK };
        for r in 0..s.rows {
            for t in t0..t1 {
                // SAFETY: as in `tile`: tap t of kernel row r, each pixel's valid column.
                unsafe {
                    let wv = _mm512_loadu_ps(w.add(r * s.w_row_stride + t * BLOCK));
                    let first = x.add(r * s.x_row_stride + s.col(p0, t) * BLOCK);
                    for (j, a) in acc.iter_mut().enumerate() {
                        *a = _mm512_fmadd_ps(_mm512_loadu_ps(first.add(j * step)), wv, *a);
                    }
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: pixel p0 + j < pixels of `out`, all 16 lanes.
            unsafe { _mm512_storeu_ps(out.add((p0 + j) * BLOCK), activate16::<ACT>(*a)) };
        }
    }

    /// What a half of the block (8 lanes) holds: 8 real lanes, 4 (the lower ones), none.
    const FULL: u8 = 2;
    const QUARTER: u8 = 1;
    const OFF: u8 = 0;

    /// The real lanes of a half of kind `K` from `p`, the others zero: an 8-lane load, a
    /// 4-lane one zero-extended, or no load at all.
    ///
    /// # Safety
    ///
    /// The real lanes must be readable.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn load<const K: u8>(p: *const f32) -> __m256 {
        // SAFETY: forwarded; only the real lanes are read.
        unsafe {
            match K {
                FULL => _mm256_loadu_ps(p),
                QUARTER => _mm256_zextps128_ps256(_mm_loadu_ps(p)),
                _ => _mm256_setzero_ps(),
            }
        }
    }

    /// The whole row: border pixels one at a time over their valid taps, interior
    /// pixels in tiles of [`TILE`] (the last one narrower).
    ///
    /// # Safety
    ///
    /// As [`blocked_depthwise_row_avx2`], with halves of kinds `H0`, `H1` covering
    /// `lanes`.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row<const H0: u8, const H1: u8, const ACT: u8>(
        s: &Shape,
        x: *const f32,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
    ) {
        // SAFETY: forwarded.
        unsafe {
            match s.stride {
                1 => row_strided::<H0, H1, 1, ACT>(s, x, w, bias, out),
                2 => row_strided::<H0, H1, 2, ACT>(s, x, w, bias, out),
                _ => row_strided::<H0, H1, 0, ACT>(s, x, w, bias, out),
            }
        }
    }

    /// [`row`] with the stride `S` a constant (0: read from the record).
    ///
    /// # Safety
    ///
    /// As [`row`]; `S` is 0 or the record's stride.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_strided<const H0: u8, const H1: u8, const S: usize, const ACT: u8>(
        s: &Shape,
        x: *const f32,
        w: *const f32,
        bias: *const f32,
        out: *mut f32,
    ) {
        let init = if bias.is_null() {
            [_mm256_setzero_ps(); 2]
        } else {
            // SAFETY: the bias's lanes below `lanes`.
            unsafe { [load::<H0>(bias), load::<H1>(bias.add(8))] }
        };
        // SAFETY: forwarded (see `walk_row!`).
        unsafe {
            walk_row!(s, TILE, |N, p, taps| {
                tile::<N, H0, H1, S, ACT>(s, [x, w], init, out, p, taps)
            }; 5 4 3 2 1);
        }
    }

    /// Pixels `p0..p0 + P`, each over taps `t0..t1` (valid for all of them), stored with
    /// their padded lanes (zero: lanes not loaded are zero, and so are their sums).
    ///
    /// # Safety
    ///
    /// As [`row`], with `t0..t1` valid taps of every pixel of the tile.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn tile<const P: usize, const H0: u8, const H1: u8, const S: usize, const ACT: u8>(
        s: &Shape,
        [x, w]: [*const f32; 2],
        init: [__m256; 2],
        out: *mut f32,
        p0: usize,
        (t0, t1): (usize, usize),
    ) {
        let mut acc = [init; P];
        // pixel j's column is pixel p0's plus j·stride: one address per tap, the
        // pixels' loads at fixed offsets from it (immediates for a constant stride)
        let step = if S == 0 { s.stride * BLOCK } else { S * BLOCK };
        for r in 0..s.rows {
            for t in t0..t1 {
                // SAFETY: the contract's indices: tap t of kernel row r, and for each
                // pixel its input column (valid: inside 0..cols), lanes below `lanes`.
                unsafe {
                    let wt = w.add(r * s.w_row_stride + t * BLOCK);
                    let wv = [load::<H0>(wt), load::<H1>(wt.add(8))];
                    let first = x.add(r * s.x_row_stride + s.col(p0, t) * BLOCK);
                    for (j, a) in acc.iter_mut().enumerate() {
                        let xp = first.add(j * step);
                        a[0] = _mm256_fmadd_ps(load::<H0>(xp), wv[0], a[0]);
                        if H1 != OFF {
                            a[1] = _mm256_fmadd_ps(load::<H1>(xp.add(8)), wv[1], a[1]);
                        }
                    }
                }
            }
        }
        for (j, a) in acc.iter().enumerate() {
            // SAFETY: pixel p0 + j < pixels of `out`, all 16 lanes.
            unsafe {
                let o = out.add((p0 + j) * BLOCK);
                // (a padded lane's zero stays zero through ReLU and hard-swish)
                _mm256_storeu_ps(o, activate8::<ACT>(a[0]));
                _mm256_storeu_ps(o.add(8), activate8::<ACT>(a[1]));
            }
        }
    }
}
