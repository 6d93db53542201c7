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

mod cost;
mod input;
mod output;
mod weights;

use smelt_ir::loops::winograd::{AT_F2, AT_F4, BT_F2, BT_F4};
use smelt_ir::loops::{BinOp, Expr, KernelBuilder, Width};
use smelt_ir::op::Conv2dAttrs;
use smelt_ir::{Diagnostic, TensorType, Value};

use super::conv::{
    nhwc_border_kernel, nhwc_pad_kernel, pad_kernel, Geo, PackedConv, CHANNEL_BLOCK, CHANNEL_BLOCKS,
};
use super::elementwise::Epilogue;
use super::{BufferId, Cx};

use cost::choose;
use input::{input_transform, input_transform_blocked};
use output::output_transform;
use weights::transform_weights;

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
        // the native input routines' matrices, so both compute the same sums
        match self {
            Form::F2 => rows(&BT_F2),
            Form::F4 => rows(&BT_F4),
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
        // the native output routines' matrices, so both compute the same sums
        match self {
            Form::F2 => rows(&AT_F2),
            Form::F4 => rows(&AT_F4),
        }
    }
}

/// A matrix of `f32` rows as `f64` rows.
fn rows<const A: usize>(matrix: &[[f32; A]]) -> Vec<Vec<f64>> {
    matrix
        .iter()
        .map(|r| r.iter().map(|&v| f64::from(v)).collect())
        .collect()
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

    /// Tiles a plane of `V` and `M` is laid out for: the tiles, made odd. `V` and `M`
    /// are α² planes (and channel blocks) whose strides are multiples of the tile
    /// count; an even count such as 160²'s 1600 makes them multiples of 4 KiB, so the
    /// 36 values of one tile (one per plane) fall in one L1 set and the transforms
    /// thrash it (measured: the input transform at 96 channels 160² ran at 3.7 GB/s,
    /// 8.8 ms, against 0.06 ms at 40²). An odd stride spreads them over the sets; the
    /// tile past the last is never written or read.
    fn tile_stride(&self) -> usize {
        self.tiles() | 1
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

    // the batched product as a grouped 1×1 convolution over [1, α²·C, 1, tiles]
    // (NCHW: `V[ξ][c][t]`, so a tile's pixels are consecutive; rows `stride` long); on
    // a micro-kernel, any output channel count in quads (the last block zero-padded:
    // `U` and `M` hold whole blocks, the output transform reads the real channels)
    let stride = p.tile_stride();
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
        wq: stride,
    };
    let product = PackedConv::padded_uniform(&gemm, p.o, false, cx.opts.micro)
        .ok_or_else(|| cx.unsupported("winograd's product needs output channels in quads"))?;

    // 1. padding, bottom and right enough for whole tiles; when the product runs on a
    // micro-kernel and the channels are whole blocks, into channel blocks, so that the
    // input transform runs on vectors of 4 channels of one tile (no transposes) and
    // stores `V` in blocks, which the micro-kernel reads as it reads any blocked input
    // (Cranelift's tiles read `V` NCHW)
    let blocked = product.micro.is_some() && p.c.is_multiple_of(CHANNEL_BLOCK);
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
    let v = cx.temp("wino_v", a2 * p.c * stride);
    if blocked {
        input_transform_blocked(cx, p, xp, v)?;
    } else {
        input_transform(cx, p, xp, v)?;
    }

    // 3. the batched product
    let packed = product
        .with_lane_blocked_output()
        .with_channel_blocks(blocked, false);
    let (lanes, (o, c)) = (packed.lanes(), (p.o, p.c));
    let padded_o = packed.blocks * lanes;
    let recipe = format!("winograd {form:?} o{o} c{c} lanes{lanes}");
    let ubuf = cx.constant_later_from(
        wdata,
        recipe,
        ("wino_u", a2 * padded_o * c),
        Box::new(move |slab| transform_weights(form, o, c, wdata, lanes, slab)),
    );
    if p.out_blocked && (!lanes.is_multiple_of(CHANNEL_BLOCK) || packed.ragged()) {
        return Err(cx.unsupported("winograd into nchw16c needs a micro-kernel's whole tiles"));
    }
    // one tile more than the product writes: F2's output transform pairs a row's odd
    // last tile with the next one, whose lanes it never stores
    let mbuf = cx.temp("wino_m", (a2 * stride + 1) * padded_o);
    let none = Epilogue::new(cx, &[], &[], &[]);
    packed.kernel(cx, &gemm, v, ubuf, &operands[..2], none, mbuf)?;

    // 4. output transform, bias, post-ops
    let bias = operands.get(2).map(|&b| cx.buf(b));
    output_transform(cx, p, [mbuf, out], lanes, bias, epi)
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
