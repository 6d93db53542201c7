//! Winograd F(m×m, 3×3) convolution for 3×3 stride-1 dilation-1 convs with constant weights.
//!
//! Four kernels: padding (zero rows and columns enough for whole tiles), the input
//! transform `V[ξ][c][t] = (Bᵀ·d·B)[ξ]` over `α×α` input tiles `d` (`α = m + 2`), the
//! batched product `M[ξ][o][t] = Σ_c U[ξ][o][c]·V[ξ][c][t]` — a grouped 1×1 convolution
//! with `α²` groups over `tiles` pixels, so it reuses [`PackedConv`] — and the output
//! transform `Y = Aᵀ·M·A` with bias and the fused post-ops, stored as output rows. The
//! transformed weights `U = G·g·Gᵀ` are computed at compile time in f64.
//!
//! With a micro-kernel and whole blocks of 16 channels, the input is padded into channel
//! blocks (`[n][c/16][hp][wp][16]`: NCHW is N·C/16 images of 16 channels, so this is the
//! channels-last copy of those), the input transform runs on vectors of 4 channels of
//! one tile — loads and stores whole, no transposes, one loop body for every tile count
//! — and stores `V[ξ][c/16][t][16]`, which the product's micro-kernel reads as any
//! channel-blocked input (ResNet-50's Winograd layers 6–12% faster).
//!
//! Otherwise `V` is NCHW-like (tiles innermost): the product's pixel loads are then
//! consecutive. (Channels-last `V[t][ξ][c]` puts the 12 pixels of a register tile
//! `α²·C·4` bytes apart — a multiple of 4 KiB for F2 at 64 channels and F4 at 256 — so
//! they share one L1 set: the F2 product at C64 56² ran at 14 GFLOP/s that way.) The
//! input transform runs on vectors of 4 horizontally adjacent tiles (lane = tile), with
//! 4×4 transposes between rows of pixels and tile columns; tiles left over at a row's end
//! run on scalars. `M` is stored in blocks of the product tile's lanes (`[ξ][o / L][t][L]`,
//! [`PackedConv::lane_blocked_output`]): a micro-kernel writes it directly, with no
//! epilogue, each tile's lanes as whole vectors (by quads of channels a plane apart, its
//! earlier layout, the stores cost the product 13–28% at 64–128 channels), and the output
//! transform runs on vectors of 4 channels of one tile, a block's quads one after the
//! other on each step of tiles, so each block's tiles are one stream. A result in
//! channel blocks (`nchw16c`, as the layout pass chooses) takes those vectors as they
//! are: per 16 channels, 4 output row streams instead of 64 channel rows of NCHW.

use smelt_ir::loops::{Access, Affine, BinOp, BufId, Expr, KernelBuilder, TileTarget, Width};
use smelt_ir::op::Conv2dAttrs;
use smelt_ir::{AlignedBuf, Diagnostic, Layout, TensorType, Value};

use super::conv::{
    nhwc_border_kernel, nhwc_pad_kernel, pad_kernel, transpose4, Geo, PackedConv, CHANNEL_BLOCK,
    CHANNEL_BLOCKS,
};
use super::elementwise::{dims_name, Epilogue};
use super::{BufferId, ConvAlgorithm, Cx};

/// One Winograd form: output tile `m×m`, input tile `α×α`, and its matrices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// F(2×2, 3×3): α = 4.
    F2,
    /// F(4×4, 3×3): α = 6.
    F4,
}

impl Form {
    fn m(self) -> usize {
        match self {
            Form::F2 => 2,
            Form::F4 => 4,
        }
    }

    fn alpha(self) -> usize {
        self.m() + 2
    }

    /// Bᵀ (α×α): input tile → transformed tile, along each axis.
    fn bt(self) -> Vec<Vec<f64>> {
        match self {
            Form::F2 => vec![
                vec![1.0, 0.0, -1.0, 0.0],
                vec![0.0, 1.0, 1.0, 0.0],
                vec![0.0, -1.0, 1.0, 0.0],
                vec![0.0, 1.0, 0.0, -1.0],
            ],
            Form::F4 => vec![
                vec![4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
                vec![0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
                vec![0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
                vec![0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
                vec![0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
                vec![0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
            ],
        }
    }

    /// G (α×3): filter → transformed filter, along each axis (the reference for
    /// [`g_f2`] and [`g_f4`]).
    #[cfg(test)]
    fn g(self) -> Vec<Vec<f64>> {
        match self {
            Form::F2 => vec![
                vec![1.0, 0.0, 0.0],
                vec![0.5, 0.5, 0.5],
                vec![0.5, -0.5, 0.5],
                vec![0.0, 0.0, 1.0],
            ],
            Form::F4 => vec![
                vec![1.0 / 4.0, 0.0, 0.0],
                vec![-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
                vec![-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
                vec![1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
                vec![1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
                vec![0.0, 0.0, 1.0],
            ],
        }
    }

    /// Aᵀ (m×α): transformed product → output tile, along each axis.
    fn at(self) -> Vec<Vec<f64>> {
        match self {
            Form::F2 => vec![vec![1.0, 1.0, 1.0, 0.0], vec![0.0, 1.0, -1.0, -1.0]],
            Form::F4 => vec![
                vec![1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
                vec![0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
                vec![0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
                vec![0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
            ],
        }
    }
}

/// The plan for one convolution: its form and shapes.
pub(super) struct Plan {
    form: Form,
    n: usize,
    c: usize,
    o: usize,
    h: usize,
    w: usize,
    oh: usize,
    ow: usize,
    /// Top and left padding.
    pt: usize,
    pl: usize,
    /// Tile rows and columns per image.
    th: usize,
    tw: usize,
    /// The result is in channel blocks (`nchw16c`).
    out_blocked: bool,
}

impl Plan {
    fn tiles(&self) -> usize {
        self.n * self.th * self.tw
    }

    /// Rows and columns of the padded input: whole tiles, plus the columns the vector
    /// loads of the last group of 4 tiles reach (F4 loads one vector past the group).
    fn padded(&self) -> [usize; 2] {
        let m = self.form.m();
        let extra = match self.form {
            Form::F2 => 2,
            Form::F4 => 4,
        };
        [self.th * m + 2, self.tw * m + extra]
    }
}

/// Bytes per cycle at which weights stream from memory on one core, measured: the F4
/// product at C512 7² (37.7 MB of `U`, 4 tiles) runs at ≈ 5 GB/s ≈ 1.6 B/cycle.
const WEIGHT_BYTES_PER_CYCLE: f64 = 1.6;

/// Bytes per cycle from the last-level cache, for weights that stay there between runs:
/// ≈ 22 GB/s, so that alone (the residual tails) the forms measured fastest win — F4 at
/// 256·14² (1.04 ms, F2 1.29), F2 at 512·7² (1.43 ms, direct 2.0); the F4 product there
/// streams 9.4 MB of `U` in < 1 ms, so the cache delivers at least 10 GB/s.
const WARM_WEIGHT_BYTES_PER_CYCLE: f64 = 8.0;

/// A function whose weights total at most this many bytes keeps them in the last-level
/// cache from one run to the next (a share of Zen 3's 32 MiB L3 that leaves room for the
/// activations); a larger one streams every weight from memory on every run.
const WARM_WEIGHTS_BUDGET: usize = 24 << 20;

/// Bytes per cycle at which this function's weights reach the core: from cache when
/// they all fit in it between runs (a single block), from memory otherwise (a network).
fn weight_bandwidth(cx: &Cx) -> f64 {
    if cx.weight_bytes() <= WARM_WEIGHTS_BUDGET {
        WARM_WEIGHT_BYTES_PER_CYCLE
    } else {
        WEIGHT_BYTES_PER_CYCLE
    }
}

/// Cycles of one extra kernel call (hand-off and loop setup), a guess that only matters
/// for tiny convolutions.
const CALL_CYCLES: f64 = 5000.0;

/// Lanes of one FMA instruction of the conv tiles: Cranelift's f32x4, or the
/// micro-kernel's f32x8 (AVX2) or f32x16 (AVX-512).
fn fma_lanes(micro: Option<TileTarget>) -> f64 {
    micro.map_or(4.0, |t| t.fma_lanes as f64)
}

/// Modelled cost (cycles on one core) of the direct packed convolution: vector FMAs at
/// 2 per cycle and 60% efficiency (measured 27–40 GFLOP/s on the 3×3 tails with f32x4),
/// or streaming the weights, whichever is slower.
fn direct_cost(t: Throughput, n: usize, c: usize, o: usize, oh: usize, ow: usize) -> f64 {
    let fmas = (n * o * c * oh * ow * 9) as f64 / t.lanes;
    let weights = (o * c * 9 * 4) as f64;
    (fmas / 2.0 / 0.6).max(weights / t.weight_bytes_per_cycle)
}

/// What the cost models need to know about the machine and the function.
#[derive(Clone, Copy)]
struct Throughput {
    /// Lanes per FMA of the conv tiles ([`fma_lanes`]).
    lanes: f64,
    /// Bytes per cycle at which weights arrive ([`weight_bandwidth`]).
    weight_bytes_per_cycle: f64,
}

/// Modelled cost of Winograd `form`, calibrated on the tails (1 thread, see
/// benches/RESULTS.md "Winograd"): the batched product at 70% of the FMA peak when a
/// register tile has ≥ 8 pixels (tiles) and proportionally less below, or streaming `U`
/// (α²/9 × the weights), whichever is slower; the transforms at their measured cycles
/// per tile and channel (vector paths; the scalar path for rows of fewer than 4 tiles
/// costs ≈ 3×); and three more kernel calls.
fn winograd_cost(
    form: Form,
    t: Throughput,
    n: usize,
    c: usize,
    o: usize,
    oh: usize,
    ow: usize,
) -> f64 {
    let (m, a) = (form.m(), form.alpha());
    let tw = ow.div_ceil(m);
    let tiles = (n * oh.div_ceil(m) * tw) as f64;
    let a2 = (a * a) as f64;
    let eff = 0.7 * (tiles / 8.0).min(1.0);
    let gemm = a2 * (o * c) as f64 * tiles / t.lanes / 2.0 / eff;
    let u = a2 * (o * c * 4) as f64;
    let (tin, tout) = match form {
        Form::F2 => (20.0, 15.0),
        Form::F4 => (70.0, 45.0),
    };
    let scalar = if tw < 4 { 3.0 } else { 1.0 };
    let transforms = scalar * tiles * (tin * c as f64 + tout * o as f64);
    gemm.max(u / t.weight_bytes_per_cycle) + transforms + 3.0 * CALL_CYCLES
}

/// The Winograd plan for this convolution when it applies and the cost model prefers it
/// over the direct convolution; `None` keeps the direct path.
pub(super) fn plan(
    cx: &Cx,
    a: &Conv2dAttrs,
    operands: &[Value],
    out_ty: &TensorType,
) -> Option<Plan> {
    let form = choose(cx, a, operands, out_ty)?;
    let xt = cx.func.type_of(operands[0]);
    let wt = cx.func.type_of(operands[1]);
    let m = form.m();
    let [oh, ow] = [out_ty.dims[2], out_ty.dims[3]];
    Some(Plan {
        form,
        n: xt.dims[0],
        c: xt.dims[1],
        o: wt.dims[0],
        h: xt.dims[2],
        w: xt.dims[3],
        oh,
        ow,
        pt: a.pads[0],
        pl: a.pads[1],
        th: oh.div_ceil(m),
        tw: ow.div_ceil(m),
        out_blocked: out_ty.layout == CHANNEL_BLOCKS,
    })
}

/// The form the cost model picks, if Winograd applies at all: 3×3, stride 1, dilation 1,
/// one group, constant weights, row-major operands (the input and the result may be in
/// channel blocks on a micro-kernel), output channels a multiple of 4 (the
/// packed product's vectors), and at least 32 input and output channels: smaller
/// convolutions take microseconds either way, and stay on the direct path that the
/// thin-path tests and snapshots pin down.
fn choose(cx: &Cx, a: &Conv2dAttrs, operands: &[Value], out_ty: &TensorType) -> Option<Form> {
    if cx.opts.conv == ConvAlgorithm::Direct {
        return None;
    }
    let xt = cx.func.type_of(operands[0]);
    let wt = cx.func.type_of(operands[1]);
    let row_major = |t: &TensorType| t.layout == Layout::RowMajor;
    if a.groups != 1
        || a.strides != [1, 1]
        || a.dilations != [1, 1]
        || wt.dims[2..] != [3, 3]
        || xt.rank() != 4
        || !(row_major(xt) || (xt.layout == CHANNEL_BLOCKS && cx.opts.micro.is_some()))
        || !row_major(wt)
        || !(row_major(out_ty) || (out_ty.layout == CHANNEL_BLOCKS && cx.opts.micro.is_some()))
        || cx.const_weight(operands[1]).is_none()
    {
        return None;
    }
    let [n, c, o] = [xt.dims[0], xt.dims[1], wt.dims[0]];
    let [oh, ow] = [out_ty.dims[2], out_ty.dims[3]];
    if !o.is_multiple_of(4) || c < 32 || o < 32 || oh < 4 || ow < 4 {
        return None;
    }
    let t = Throughput {
        lanes: fma_lanes(cx.opts.micro),
        weight_bytes_per_cycle: weight_bandwidth(cx),
    };
    let direct = direct_cost(t, n, c, o, oh, ow);
    [Form::F4, Form::F2]
        .into_iter()
        .map(|f| (winograd_cost(f, t, n, c, o, oh, ow), f))
        .filter(|&(cost, _)| cost < direct)
        .min_by(|x, y| x.0.total_cmp(&y.0))
        .map(|(_, f)| f)
}

/// Lowers the convolution by `plan`: pad, input transform, batched product, output
/// transform with bias and `epi`.
pub(super) fn lower(
    cx: &mut Cx,
    p: &Plan,
    operands: &[Value],
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let form = p.form;
    let a2 = form.alpha() * form.alpha();
    let tiles = p.tiles();
    let wdata = cx
        .const_weight(operands[1])
        .ok_or_else(|| cx.unsupported("winograd conv2d with non-constant weights"))?;

    // 1. padding, bottom and right enough for whole tiles; with a micro-kernel and whole
    // blocks of channels, into channel blocks, so that the input transform runs on
    // vectors of 4 channels of one tile (no transposes) and stores `V` in blocks, which
    // the product's micro-kernel reads as it reads any blocked input
    let blocked = cx.opts.micro.is_some() && p.c.is_multiple_of(CHANNEL_BLOCK);
    let x = cx.buf(operands[0]);
    let [hp, wp] = p.padded();
    let padded_len = p.n * p.c * hp * wp;
    let xp = cx.temp("wino_padded", padded_len);
    let x_blocked = cx.func.type_of(operands[0]).layout == CHANNEL_BLOCKS;
    if x_blocked && !blocked {
        return Err(cx.unsupported("winograd on nchw16c input needs a micro-kernel"));
    }
    let k = if x_blocked {
        // rows of 16-channel pixels: the plain padding copy, on rows 16 times as long
        let unit = CHANNEL_BLOCK;
        let images = p.n * p.c / unit;
        let [h, w] = [p.h, p.w * unit];
        let (pads, padded) = ([p.pt, p.pl * unit], [hp, wp * unit]);
        pad_kernel(
            images,
            [h, w],
            pads,
            1,
            padded,
            0.0,
            cx.len_of(x),
            padded_len,
        )
    } else if blocked {
        // NCHW with C channels is NCHW of N·C/16 images of 16 channels, and channel
        // blocks are those images channels-last
        let images = p.n * p.c / CHANNEL_BLOCK;
        let border = nhwc_border_kernel(images, CHANNEL_BLOCK, [p.h, hp, wp], p.pt, padded_len);
        cx.step(border, vec![xp])?;
        let (hw, pads) = ([p.h, p.w], [p.pt, p.pl]);
        nhwc_pad_kernel(
            images,
            CHANNEL_BLOCK,
            false,
            hw,
            pads,
            [hp, wp],
            cx.len_of(x),
            padded_len,
        )
    } else {
        pad_kernel(
            p.n * p.c,
            [p.h, p.w],
            [p.pt, p.pl],
            1,
            [hp, wp],
            0.0,
            cx.len_of(x),
            padded_len,
        )
    };
    cx.step(k, vec![x, xp])?;

    // 2. input transform
    let v = cx.temp("wino_v", a2 * p.c * tiles);
    if blocked {
        input_transform_blocked(cx, p, xp, v)?;
    } else {
        input_transform(cx, p, xp, v)?;
    }

    // 3. batched product as a grouped 1×1 convolution over [1, α²·C, 1, tiles]
    // (NCHW: `V[ξ][c][t]`, so a tile's pixels are consecutive)
    let gemm = Geo {
        n: 1,
        c: a2 * p.c,
        o: a2 * p.o,
        cg: p.c,
        og: p.o,
        groups: a2,
        kh: 1,
        kw: 1,
        oh: 1,
        ow: tiles,
        stride: [1, 1],
        dil: [1, 1],
        hp: 1,
        phases: 1,
        wq: tiles,
    };
    let packed = PackedConv::new(&gemm, p.o, false, cx.opts.micro)
        .with_lane_blocked_output()
        .with_channel_blocks(blocked, false);
    let (lanes, (o, c)) = (packed.lanes(), (p.o, p.c));
    let ubuf = cx.constant_later(
        "wino_u",
        a2 * o * c,
        Box::new(move || transform_weights(form, o, c, wdata, lanes)),
    );
    if p.out_blocked && !lanes.is_multiple_of(CHANNEL_BLOCK) {
        return Err(cx.unsupported("winograd into nchw16c needs a micro-kernel's tiles"));
    }
    // one tile more than the product writes: F2's output transform pairs a row's odd
    // last tile with the next one, whose lanes it never stores
    let mbuf = cx.temp("wino_m", (a2 * tiles + 1) * p.o);
    let none = Epilogue::new(cx, &[], &[], &[]);
    packed.kernel(cx, &gemm, v, ubuf, &operands[..2], none, mbuf)?;

    // 4. output transform, bias, post-ops
    let bias = operands.get(2).map(|&b| cx.buf(b));
    output_transform(cx, p, [mbuf, out], lanes, bias, epi)
}

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
fn transform_weights(form: Form, o: usize, c: usize, w: &AlignedBuf, lanes: usize) -> AlignedBuf {
    let (w, scale) = match crate::scaled_rows::ScaledRows::parts(w) {
        Some((values, scale)) if scale.len() == o => (values, Some(scale)),
        _ => (w.as_f32(), None),
    };
    match form {
        Form::F2 => transform_with::<4>(o, c, w, scale, lanes, g_f2),
        Form::F4 => transform_with::<6>(o, c, w, scale, lanes, g_f4),
    }
}

/// Four f64 values computed alike (one per output channel), so the transform's
/// arithmetic vectorizes.
#[derive(Clone, Copy, Default)]
struct V4([f64; 4]);

impl std::ops::Add for V4 {
    type Output = V4;
    fn add(self, r: V4) -> V4 {
        V4(std::array::from_fn(|i| self.0[i] + r.0[i]))
    }
}

impl std::ops::Sub for V4 {
    type Output = V4;
    fn sub(self, r: V4) -> V4 {
        V4(std::array::from_fn(|i| self.0[i] - r.0[i]))
    }
}

impl std::ops::Mul<f64> for V4 {
    type Output = V4;
    fn mul(self, k: f64) -> V4 {
        V4(self.0.map(|x| x * k))
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
) -> AlignedBuf {
    let plane = o * c;
    AlignedBuf::from_f32_with(A * A * plane, |u| {
        // (the packed product's blocks of `lanes` channels always divide `o`)
        if lanes == 0 || !o.is_multiple_of(lanes) || w.len() < plane * 9 {
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
                        let tap = |i: usize, j: usize| -> f64 {
                            let oi = ob * lanes + l0 + j;
                            if oi >= o || l0 + j >= lanes {
                                return 0.0;
                            }
                            let x = w[(oi * c + c0 + ci) * 9 + i];
                            f64::from(match scale {
                                Some(s) => crate::scaled_rows::ScaledRows::value(x, s[oi]),
                                None => x,
                            })
                        };
                        let f: [V4; 9] =
                            std::array::from_fn(|i| V4(std::array::from_fn(|j| tap(i, j))));
                        // G·f: column j of the filter → column j of an α×3 matrix
                        let cols: [[V4; A]; 3] =
                            std::array::from_fn(|j| g([f[j], f[3 + j], f[6 + j]]));
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

/// `Σ_i k[i]·x[i]` with the zero terms skipped and ±1 as adds and subtracts, bound to a
/// variable.
fn combine(b: &mut KernelBuilder, k: &[f64], xs: &[Expr], w: Width) -> Expr {
    // start from a +1 term when there is one, so no negation is needed
    let first = k
        .iter()
        .position(|&v| v == 1.0)
        .or_else(|| k.iter().position(|&v| v != 0.0));
    let Some(first) = first else {
        return Expr::constant(0.0, w);
    };
    let mut acc = if k[first] == 1.0 {
        xs[first].clone()
    } else {
        Expr::binary(
            BinOp::Mul,
            xs[first].clone(),
            Expr::constant(k[first] as f32, w),
        )
    };
    for (i, (&ki, x)) in k.iter().zip(xs).enumerate() {
        if i == first || ki == 0.0 {
            continue;
        }
        acc = if ki == 1.0 {
            Expr::binary(BinOp::Add, acc, x.clone())
        } else if ki == -1.0 {
            Expr::binary(BinOp::Sub, acc, x.clone())
        } else {
            Expr::fma(x.clone(), Expr::constant(ki as f32, w), acc)
        };
    }
    b.let_(acc, w)
}

/// `Bᵀ·d·B` of one input tile (or 4 tiles, one per lane), given `row(b, i)` = the α values
/// of tile row `i`; `store(b, ξ, value)` receives each transformed value.
fn input_tile(
    b: &mut KernelBuilder,
    form: Form,
    w: Width,
    row: &mut dyn FnMut(&mut KernelBuilder, usize) -> Vec<Expr>,
    store: &mut dyn FnMut(&mut KernelBuilder, usize, Expr),
) {
    let a = form.alpha();
    let bt = form.bt();
    // t[i][l] = Σ_j d[i][j]·Bᵀ[l][j]: transform each row as it is loaded
    let t: Vec<Vec<Expr>> = (0..a)
        .map(|i| {
            let d = row(b, i);
            bt.iter().map(|btl| combine(b, btl, &d, w)).collect()
        })
        .collect();
    // V[k][l] = Σ_i Bᵀ[k][i]·t[i][l]
    for l in 0..a {
        let col: Vec<Expr> = t.iter().map(|ti| ti[l].clone()).collect();
        for (k, btk) in bt.iter().enumerate() {
            let v = combine(b, btk, &col, w);
            store(b, k * a + l, v);
        }
    }
}

/// `Aᵀ·M·A` of one tile (or 4 tiles, one per lane), given `load(ξ)`; returns the `m×m`
/// outputs by row.
fn output_tile(
    b: &mut KernelBuilder,
    form: Form,
    w: Width,
    load: &dyn Fn(usize) -> Expr,
) -> Vec<Vec<Expr>> {
    let (a, m) = (form.alpha(), form.m());
    let at = form.at();
    // s[r][l] = Σ_k Aᵀ[r][k]·M[k][l], one column of M at a time
    let mut s: Vec<Vec<Expr>> = vec![Vec::with_capacity(a); m];
    for l in 0..a {
        let col: Vec<Expr> = (0..a).map(|k| b.let_(load(k * a + l), w)).collect();
        for (r, atr) in at.iter().enumerate() {
            let v = combine(b, atr, &col, w);
            s[r].push(v);
        }
    }
    // Y[r][j] = Σ_l s[r][l]·Aᵀ[j][l]
    s.iter()
        .map(|sr| at.iter().map(|atj| combine(b, atj, sr, w)).collect())
        .collect()
}

/// Padded NCHW input → `V[ξ][c][t]` (`t = (n·TH + th)·TW + tw`). Vectors hold one value
/// of 4 horizontally adjacent tiles: 4 row vectors (one per tile) are transposed into
/// the tiles' columns 0–3; for F4, columns 4 and 5 are columns 0 and 1 of the next
/// tile, shifted in from one more load. The last group overlaps the one before when the
/// tile count is not a multiple of 4 (it rewrites identical values); rows of fewer than
/// 4 tiles go tile by tile on scalars. Parallel over input channels.
fn input_transform(cx: &mut Cx, p: &Plan, xp: BufferId, v: BufferId) -> Result<(), Diagnostic> {
    let form = p.form;
    let (m, a) = (form.m(), form.alpha());
    let [hp, wp] = p.padded();
    let tiles = p.tiles() as i64;
    let mut b = KernelBuilder::new(&format!(
        "winograd{m}_input_{}",
        dims_name(&[p.n, p.c, hp, wp])
    ));
    let xa = b.arg("padded", cx.len_of(xp), Access::Read);
    let va = b.arg("v", cx.len_of(v), Access::Write);
    let c_count = p.c as i64;
    let x_at = |n: &Affine, c: &Affine, row: &Affine, col: &Affine| {
        n.scale((p.c * hp * wp) as i64)
            .add(&c.scale((hp * wp) as i64))
            .add(&row.scale(wp as i64))
            .add(col)
    };
    let v_at = |xi: usize, c: &Affine, t: &Affine| c.plus(xi as i64 * c_count).scale(tiles).add(t);
    let tile_of = |n: &Affine, th: &Affine, tw: &Affine| {
        n.scale((p.th * p.tw) as i64)
            .add(&th.scale(p.tw as i64))
            .add(tw)
    };
    let w4 = Width::F32x4;
    b.set_parallel();
    b.for_loop(0, p.c as i64, 1, |b, c| {
        let c = Affine::var(c);
        b.for_loop(0, p.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            b.for_loop(0, p.th as i64, 1, |b, th| {
                let th = Affine::var(th);
                let group = |b: &mut KernelBuilder, tw0: &Affine| {
                    let t = tile_of(&n, &th, tw0);
                    let mut row = |b: &mut KernelBuilder, i: usize| -> Vec<Expr> {
                        let r = th.scale(m as i64).plus(i as i64);
                        let base = x_at(&n, &c, &r, &tw0.scale(m as i64));
                        let quads: Vec<Expr> = (0..4)
                            .map(|k| Expr::load(xa, base.plus((k * m) as i64), w4))
                            .collect();
                        let mut cols = transpose4(b, &quads);
                        if form == Form::F4 {
                            let next = b.let_(Expr::load(xa, base.plus(16), w4), w4);
                            let c4 = Expr::shuffle(cols[0].clone(), next.clone(), [1, 2, 3, 4]);
                            let c5 = Expr::shuffle(cols[1].clone(), next, [1, 2, 3, 5]);
                            cols.push(b.let_(c4, w4));
                            cols.push(b.let_(c5, w4));
                        }
                        cols
                    };
                    let mut store = |b: &mut KernelBuilder, xi: usize, val: Expr| {
                        b.store(va, v_at(xi, &c, &t), val, w4);
                    };
                    input_tile(b, form, w4, &mut row, &mut store);
                };
                let single = |b: &mut KernelBuilder, tw: &Affine| {
                    let t = tile_of(&n, &th, tw);
                    let mut row = |_: &mut KernelBuilder, i: usize| -> Vec<Expr> {
                        let r = th.scale(m as i64).plus(i as i64);
                        let base = x_at(&n, &c, &r, &tw.scale(m as i64));
                        (0..a)
                            .map(|j| Expr::load(xa, base.plus(j as i64), Width::Scalar))
                            .collect()
                    };
                    let mut store = |b: &mut KernelBuilder, xi: usize, val: Expr| {
                        b.store(va, v_at(xi, &c, &t), val, Width::Scalar);
                    };
                    input_tile(b, form, Width::Scalar, &mut row, &mut store);
                };
                let main = p.tw / 4 * 4;
                b.for_loop(0, main as i64, 4, |b, tw| group(b, &Affine::var(tw)));
                if main < p.tw {
                    if p.tw >= 4 {
                        group(b, &Affine::constant(p.tw as i64 - 4));
                    } else {
                        b.for_loop(0, p.tw as i64, 1, |b, tw| single(b, &Affine::var(tw)));
                    }
                }
            });
        });
    });
    cx.step(b.finish(), vec![xp, v])
}

/// Input in channel blocks (`[n][c/16][hp][wp][16]`, padded) → `V` in channel blocks,
/// `V[ξ][c/16][t][16]` (for the product, input channel `ξ·C + c` of tile `t`): each tile,
/// each quad of its 16 channels, is transformed on vectors of those 4 channels, loaded
/// and stored whole (no transposes, one loop body for every tile count). Parallel over
/// channel blocks.
fn input_transform_blocked(
    cx: &mut Cx,
    p: &Plan,
    xp: BufferId,
    v: BufferId,
) -> Result<(), Diagnostic> {
    let form = p.form;
    let m = form.m();
    let [hp, wp] = p.padded();
    let tiles = p.tiles() as i64;
    let unit = CHANNEL_BLOCK as i64;
    let blocks = (p.c / CHANNEL_BLOCK) as i64;
    let mut b = KernelBuilder::new(&format!(
        "winograd{m}_input_{}c16",
        dims_name(&[p.n, p.c, hp, wp])
    ));
    let xa = b.arg("padded", cx.len_of(xp), Access::Read);
    let va = b.arg("v", cx.len_of(v), Access::Write);
    let w4 = Width::F32x4;
    b.set_parallel();
    b.for_loop(0, blocks, 1, |b, cb| {
        let cb = Affine::var(cb);
        b.for_loop(0, p.n as i64, 1, |b, n| {
            let n = Affine::var(n);
            let plane = n.scale(blocks).add(&cb).scale((hp * wp) as i64 * unit);
            b.for_loop(0, p.th as i64, 1, |b, th| {
                let th = Affine::var(th);
                b.for_loop(0, p.tw as i64, 1, |b, tw| {
                    let tw = Affine::var(tw);
                    let t = n
                        .scale((p.th * p.tw) as i64)
                        .add(&th.scale(p.tw as i64))
                        .add(&tw);
                    b.for_loop(0, unit, 4, |b, q| {
                        let q = Affine::var(q);
                        let mut row = |_: &mut KernelBuilder, i: usize| -> Vec<Expr> {
                            let r = th.scale(m as i64).plus(i as i64);
                            let base = plane
                                .add(&r.scale(wp as i64 * unit))
                                .add(&tw.scale(m as i64 * unit))
                                .add(&q);
                            (0..form.alpha())
                                .map(|j| Expr::load(xa, base.plus(j as i64 * unit), w4))
                                .collect()
                        };
                        let mut store = |b: &mut KernelBuilder, xi: usize, val: Expr| {
                            let block = cb.plus(xi as i64 * blocks);
                            let at = block.scale(tiles).add(&t).scale(unit).add(&q);
                            b.store(va, at, val, w4);
                        };
                        input_tile(b, form, w4, &mut row, &mut store);
                    });
                });
            });
        });
    });
    cx.step(b.finish(), vec![xp, v])
}

/// `M` stored in blocks of `lanes` channels (`[ξ][o / lanes][t][lanes]`) → `Y = Aᵀ·M·A`
/// with bias and post-ops, NCHW or in channel blocks. Vectors hold the 4 channels of a
/// quad at one tile, so every tile and channel count runs on vectors. In channel blocks
/// each output pixel's vector is stored as it is; NCHW, a 4×4 transpose turns 4 output
/// columns × 4 channels into 4 channels × 4 columns for the post-ops and the stores
/// along W (F2 pairs horizontally adjacent tiles for its 4 columns), and columns past
/// the right edge are stored lane by lane. Each step of tiles runs every quad of one
/// block in turn, so a block's tiles of each ξ plane are read as one stream, each line
/// once. Parallel over tile rows or blocks; a last tile row reaching past the image is a
/// second, serial kernel.
fn output_transform(
    cx: &mut Cx,
    p: &Plan,
    [mbuf, out]: [BufferId; 2],
    lanes: usize,
    bias: Option<BufferId>,
    mut epi: Epilogue,
) -> Result<(), Diagnostic> {
    let m = p.form.m();
    let full_rows = p.oh / m;
    let rows = |last| OutputRows { lanes, last };
    if full_rows > 0 {
        output_transform_rows(cx, p, [mbuf, out], bias, &mut epi, rows(None))?;
    }
    if full_rows < p.th {
        output_transform_rows(cx, p, [mbuf, out], bias, &mut epi, rows(Some(full_rows)))?;
    }
    Ok(())
}

/// Which kernel of [`output_transform`]: `M`'s block size, and every whole tile row
/// (`last` `None`, a parallel kernel) or tile row `last`, whose outputs reach past the
/// image's last row.
struct OutputRows {
    lanes: usize,
    last: Option<usize>,
}

/// One kernel of [`output_transform`].
fn output_transform_rows(
    cx: &mut Cx,
    p: &Plan,
    [mbuf, out]: [BufferId; 2],
    bias: Option<BufferId>,
    epi: &mut Epilogue,
    OutputRows { lanes, last }: OutputRows,
) -> Result<(), Diagnostic> {
    let form = p.form;
    let m = form.m();
    let tiles = p.tiles() as i64;
    let mut b = KernelBuilder::new(&format!(
        "winograd{m}_output_{}_lb{lanes}{}{}{}{}",
        dims_name(&[p.n, p.o, p.oh, p.ow]),
        if p.out_blocked { "_out16c" } else { "" },
        if bias.is_some() { "_bias" } else { "" },
        if epi.is_empty() { "" } else { "_fused" },
        if last.is_some() { "_last_row" } else { "" }
    ));
    let ma = b.arg("m", cx.len_of(mbuf), Access::Read);
    let mut args = vec![mbuf];
    let ba: Option<BufId> = bias.map(|bb| {
        args.push(bb);
        b.arg("bias", cx.len_of(bb), Access::Read)
    });
    args.extend(epi.declare(&mut b));
    let ya = b.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let w4 = Width::F32x4;
    // M[ξ][o / lanes][t][lanes]: quad `qi` of block `blk` at tile `t`
    let blocks = (p.o / lanes) as i64;
    let m_at = |xi: usize, blk: &Affine, qi: &Affine, t: &Affine| {
        blk.plus(xi as i64 * blocks)
            .scale(tiles)
            .add(t)
            .scale(lanes as i64)
            .add(&qi.scale(4))
    };
    let out_at = |n: &Affine, o: &Affine, row: &Affine, col: &Affine| {
        n.scale((p.o * p.oh * p.ow) as i64)
            .add(&o.scale((p.oh * p.ow) as i64))
            .add(&row.scale(p.ow as i64))
            .add(col)
    };
    // in channel blocks, `[n][o / 16][oh][ow][16]`: the first of 4 channels at
    // `within` of block `block`
    let unit = CHANNEL_BLOCK as i64;
    let stored_at = |n: &Affine, [block, within]: [&Affine; 2], row: &Affine, col: &Affine| {
        n.scale((p.o / CHANNEL_BLOCK) as i64)
            .add(block)
            .scale((p.oh * p.ow) as i64)
            .add(&row.scale(p.ow as i64))
            .add(col)
            .scale(unit)
            .add(within)
    };
    let epi = &*epi;
    // tiles per step along a row: F2's 2 columns per tile are paired into 4
    let per_step = 4 / m;
    // `per_step` tiles of image `n` from tile column `tw0` of tile row `th`, of which
    // `rows` output rows and `cols` output columns are inside the image, for quad `qi`
    // of block `blk` (in channel blocks, `stored` = the output block and the quad's
    // first channel within it)
    let quad_step = |b: &mut KernelBuilder,
                     n: &Affine,
                     [blk, qi]: [&Affine; 2],
                     stored: Option<[&Affine; 2]>,
                     th: &Affine,
                     tw0: &Affine,
                     rows: usize,
                     cols: usize| {
        let o0 = blk.scale(lanes as i64).add(&qi.scale(4));
        let bias_v = ba.map(|bb| b.let_(Expr::load(bb, o0.clone(), w4), w4));
        // ys[k][r][j]: output (r, j) of tile `tw0 + k`, 4 channels
        let ys: Vec<Vec<Vec<Expr>>> = (0..per_step)
            .map(|k| {
                let t = n
                    .scale((p.th * p.tw) as i64)
                    .add(&th.scale(p.tw as i64))
                    .add(&tw0.plus(k as i64));
                let load = |xi: usize| Expr::load(ma, m_at(xi, blk, qi, &t), w4);
                output_tile(b, form, w4, &load)
            })
            .collect();
        let bias = |e: Expr| match &bias_v {
            Some(bv) => Expr::binary(BinOp::Add, e, bv.clone()),
            None => e,
        };
        if let Some(block) = stored {
            for r in 0..rows {
                let row = th.scale(m as i64).plus(r as i64);
                let pixels = ys.iter().flat_map(|y| y[r].iter().cloned());
                for (j, v) in pixels.enumerate().take(cols) {
                    let col = tw0.scale(m as i64).plus(j as i64);
                    let idx = [n.clone(), o0.clone(), row.clone(), col.clone()];
                    let at = stored_at(n, block, &row, &col);
                    let val = epi.apply_along_channels(b, bias(v), &idx, &at, w4);
                    b.store(ya, at, val, w4);
                }
            }
            return;
        }
        for r in 0..rows {
            let row = th.scale(m as i64).plus(r as i64);
            let columns: Vec<Expr> = ys
                .iter()
                .flat_map(|y| y[r].iter().cloned())
                .map(bias)
                .collect();
            let col = tw0.scale(m as i64);
            for (k, channel) in transpose4(b, &columns).into_iter().enumerate() {
                let o = o0.plus(k as i64);
                if cols >= 4 {
                    let idx = [n.clone(), o.clone(), row.clone(), col.clone()];
                    let val = epi.apply(b, channel, &idx, w4);
                    b.store(ya, out_at(n, &o, &row, &col), val, w4);
                    continue;
                }
                let channel = b.let_(channel, w4);
                for j in 0..cols {
                    let col = col.plus(j as i64);
                    let s = Expr::lane(channel.clone(), j as u8);
                    let idx = [n.clone(), o.clone(), row.clone(), col.clone()];
                    let s = epi.apply(b, s, &idx, Width::Scalar);
                    b.store(ya, out_at(n, &o, &row, &col), s, Width::Scalar);
                }
            }
        }
    };
    // every quad of block `blk` on the `per_step` tiles from column `tw0`; in channel
    // blocks, as the 4 quads of each output block of 16 channels
    let step =
        |b: &mut KernelBuilder, n: &Affine, blk: &Affine, th: &Affine, tw0: &Affine, rows, cols| {
            if !p.out_blocked {
                return b.for_loop(0, (lanes / 4) as i64, 1, |b, qi| {
                    quad_step(b, n, [blk, &Affine::var(qi)], None, th, tw0, rows, cols)
                });
            }
            b.for_loop(0, (lanes / CHANNEL_BLOCK) as i64, 1, |b, half| {
                b.for_loop(0, 4, 1, |b, qq| {
                    let (half, qq) = (Affine::var(half), Affine::var(qq));
                    let qi = half.scale(4).add(&qq);
                    let block = blk.scale((lanes / CHANNEL_BLOCK) as i64).add(&half);
                    let within = qq.scale(4);
                    let stored = Some([&block, &within]);
                    quad_step(b, n, [blk, &qi], stored, th, tw0, rows, cols)
                })
            })
        };
    // the tiles of tile row `th` (`rows` output rows of them inside the image) in one
    // block of `M`
    let block_row = |b: &mut KernelBuilder, n: &Affine, blk: &Affine, th: &Affine, rows| {
        // tiles whose 4 columns (F2: pairs of tiles) are all inside the image
        let whole = p.ow / 4 * 4 / m;
        b.for_loop(0, whole as i64, per_step as i64, |b, tw| {
            step(b, n, blk, th, &Affine::var(tw), rows, 4)
        });
        if whole < p.tw {
            // the last columns: F4's last tile, or F2's last one or two tiles
            // (pairing an odd last tile with one past the grid, whose lanes are
            // never stored: see the length of `M` in `lower`)
            let tw0 = Affine::constant(whole as i64);
            step(b, n, blk, th, &tw0, rows, p.ow - whole * m);
        }
    };
    let tile_row = |b: &mut KernelBuilder, th: &Affine, rows: usize| {
        b.for_loop(0, p.n as i64, 1, |b, n| {
            b.for_loop(0, blocks, 1, |b, blk| {
                block_row(b, &Affine::var(n), &Affine::var(blk), th, rows)
            })
        })
    };
    let full_rows = (p.oh / m) as i64;
    match last {
        // Threads share the longer of the two loops, or the even one when both are
        // short (7 tile rows split 4:3, 4 blocks 2:2); over blocks, each thread's
        // share of `M` is whole blocks.
        None if blocks > full_rows || (full_rows < 8 && full_rows % 2 == 1 && blocks % 2 == 0) => {
            b.set_parallel();
            b.for_loop(0, blocks, 1, |b, blk| {
                b.for_loop(0, full_rows, 1, |b, th| {
                    b.for_loop(0, p.n as i64, 1, |b, n| {
                        let (n, blk) = (Affine::var(n), Affine::var(blk));
                        block_row(b, &n, &blk, &Affine::var(th), m)
                    })
                })
            });
        }
        None => {
            b.set_parallel();
            b.for_loop(0, full_rows, 1, |b, th| tile_row(b, &Affine::var(th), m));
        }
        Some(th) => tile_row(&mut b, &Affine::constant(th as i64), p.oh - th * m),
    }
    cx.step(b.finish(), args)
}

#[cfg(test)]
mod tests {
    use super::*;
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
        let (o, c) = (16, 19);
        let (lazy, values) = folded(o, c * 9);
        assert!(crate::scaled_rows::ScaledRows::parts(&lazy).is_some());
        for form in [Form::F2, Form::F4] {
            for lanes in [4, 8] {
                assert_eq!(
                    bits(&transform_weights(form, o, c, &lazy, lanes)),
                    bits(&transform_weights(form, o, c, &values, lanes)),
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
                bits(&packed.pack(&g, &lazy)),
                bits(&packed.pack(&g, &values)),
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
                let got = transform_weights(form, o, c, &AlignedBuf::from_f32(&w), lanes);
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
