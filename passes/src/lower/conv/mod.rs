//! conv2d (and fused conv2d) → padding kernels and a register-blocked convolution kernel.
//!
//! Three direct forms (3×3 stride-1 convs may go to `winograd` first):
//!
//! - **Packed** ([`packed`]; output channels per group a multiple of 4, constant
//!   weights): the input is copied into a zero-padded channels-last (NHWC) buffer, weights
//!   are packed at compile time so vectors run along output channels, and a tile is `V`
//!   channel vectors × `P` output pixels (broadcast input × weight vector FMAs). The
//!   outer loop order (channel blocks or row bands first) comes from a model of the bytes
//!   each moves from beyond L2; wide convs run their input channels in parts that fit L1.
//!   With a micro-kernel (`LowerOptions::micro`), a tile is 16 or 32 channels × up to 56–60
//!   pixels summed by the native routine into a stack buffer, then finished by the same
//!   JIT epilogue; unpadded 1×1 convs then skip the channels-last copy (strided ones
//!   read a subsampled copy) and walk their plane as rows of whole calls.
//! - **Depthwise 3×3** ([`depthwise`]; one channel per group, stride 1, padding 1, whole
//!   vectors of columns): straight from the NCHW input, the left and right taps shifted
//!   in from the neighbouring vectors, with no padded copy.
//! - **General** ([`general`]; any channel count, weights from the graph): the input is
//!   copied into a zero-padded NCHW buffer whose rows are split by column phase (`column
//!   mod stride_w`), so the input columns feeding consecutive output columns are
//!   consecutive; tiles are `OT` output channels × `WV` vectors of 4 output columns
//!   (broadcast weight, vector input).
//!
//! Neither needs bounds tests; both apply bias and post-ops to the tile in registers and
//! store it once. The padding kernels of both are in [`pad`].

mod depthwise;
mod depthwise_blocks;
mod general;
mod packed;
mod pad;

use smelt_ir::loops::{Access, Affine, BufId, Expr, KernelBuilder, TileTarget, Width};
use smelt_ir::op::Conv2dAttrs;
use smelt_ir::{Diagnostic, Layout, TensorType, Value};

use general::conv_kernel;
pub(super) use packed::PackedConv;
use pad::subsample_kernel;
pub(crate) use pad::{nhwc_border_kernel, nhwc_pad_kernel, pad_kernel};

use super::elementwise::Epilogue;
use super::{BufferId, Cx};
use crate::blocks::{depthwise_on_blocks, reads_blocks_on_micro, writes_blocks_on_micro};
pub(crate) use crate::blocks::{CHANNEL_BLOCK, CHANNEL_BLOCKS};

/// The channels a pointwise conv of `o` output channels computes on the micro-kernel
/// routines of `micro` (`o` rounded up to their lanes), or `None` when its tiles are
/// Cranelift code (no routine, or too few useful lanes): what decides whether it reads
/// channel blocks.
pub(crate) fn pointwise_micro_channels(o: usize, micro: Option<TileTarget>) -> Option<usize> {
    PackedConv::micro_channels(o, micro)
}

/// Shapes of one convolution, in elements.
#[derive(Clone)]
pub(super) struct Geo {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) o: usize,
    pub(super) cg: usize,
    pub(super) og: usize,
    pub(super) groups: usize,
    pub(super) kh: usize,
    pub(super) kw: usize,
    pub(super) oh: usize,
    pub(super) ow: usize,
    pub(super) stride: [usize; 2],
    pub(super) dil: [usize; 2],
    /// Rows of the (padded) input.
    pub(super) hp: usize,
    /// Column phases (= stride along W) and columns per phase of the (padded) input.
    pub(super) phases: usize,
    pub(super) wq: usize,
}

impl Geo {
    /// The window as kernel names spell it: `k3x3_s2x2_d1x1`.
    fn window_name(&self) -> String {
        format!(
            "k{}x{}_s{}x{}_d{}x{}",
            self.kh, self.kw, self.stride[0], self.stride[1], self.dil[0], self.dil[1]
        )
    }

    /// Element index in the padded, phase-split input.
    fn x_index(&self, n: &Affine, c: &Affine, row: &Affine, phase: usize, q: &Affine) -> Affine {
        let plane = (self.hp * self.phases * self.wq) as i64;
        n.scale(self.c as i64 * plane)
            .add(&c.scale(plane))
            .add(&row.scale((self.phases * self.wq) as i64))
            .add(&q.plus((phase * self.wq) as i64))
    }

    /// The weight of output channel `o`, input channel `c` of its group, and tap `k`
    /// (`kh · kw_size + kw`).
    fn w_index(&self, o: &Affine, c: &Affine, k: &Affine) -> Affine {
        o.scale((self.cg * self.kh * self.kw) as i64)
            .add(&c.scale((self.kh * self.kw) as i64))
            .add(k)
    }
}

pub(crate) fn lower_conv2d(
    cx: &mut Cx,
    a: &Conv2dAttrs,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let x_blocked = cx.func.type_of(operands[0]).layout != Layout::RowMajor;
    let out_blocked = out_ty.layout != Layout::RowMajor;
    let channels = cx.func.type_of(operands[0]).dims[1];
    let blocked_depthwise = x_blocked
        && out_blocked
        && depthwise_on_blocks(a, cx.func.type_of(operands[1]), channels, cx.opts.micro)
        && cx.const_weight(operands[1]).is_some()
        && epi.runs_along_channels();
    if (x_blocked || out_blocked) && !blocked_depthwise {
        let wt = cx.func.type_of(operands[1]);
        let micro = cx.opts.micro;
        // (which layouts at all: `blocks::layouts_have_kernels`, checked before any op)
        let supported = (!x_blocked || reads_blocks_on_micro(a, wt, channels, micro))
            && (!out_blocked || writes_blocks_on_micro(a, wt, micro))
            && cx.const_weight(operands[1]).is_some()
            && (!out_blocked || epi.runs_along_channels());
        if !supported {
            return Err(cx.unsupported(
                "channel-blocked (nchw16c) activations need constant weights and a \
                 micro-kernel (--kernels auto, avx2 or avx512); ungrouped convs with output \
                 channels in quads and input channels in whole blocks read them (pointwise \
                 ones a partial last block too), ungrouped convs with output channels in \
                 blocks of 16 and per-channel or full-size post-op operands write them, \
                 and depthwise convs on whole vectors of 4 channels with windows up to 7×7 \
                 read and write them together",
            ));
        }
    }
    if let Some(plan) = super::winograd::plan(cx, a, operands, out_ty) {
        return super::winograd::lower(cx, &plan, operands, epi, out);
    }
    let xt = cx.func.type_of(operands[0]).clone();
    let wt = cx.func.type_of(operands[1]).clone();
    let [n, c, h, w] = [xt.dims[0], xt.dims[1], xt.dims[2], xt.dims[3]];
    let [o, cg, kh, kw] = [wt.dims[0], wt.dims[1], wt.dims[2], wt.dims[3]];
    let [oh, ow] = [out_ty.dims[2], out_ty.dims[3]];
    let [pt, pl, pb, pr] = a.pads;
    let sw = a.strides[1];
    let hp = h + pt + pb;
    let wp = w + pl + pr;
    let geo = Geo {
        n,
        c,
        o,
        cg,
        og: o / a.groups,
        groups: a.groups,
        kh,
        kw,
        oh,
        ow,
        stride: a.strides,
        dil: a.dilations,
        hp,
        phases: sw,
        wq: wp.div_ceil(sw),
    };

    if blocked_depthwise {
        return depthwise_blocks::kernel(cx, &geo, [h, w], [pt, pl], operands, epi, out);
    }
    let x = cx.buf(operands[0]);
    let og = o / a.groups;
    // Packed tiles: output channels in quads on Cranelift's, any count a micro-kernel
    // computes at a useful fraction of its lanes (the last block zero-padded).
    let packed = cx
        .const_weight(operands[1])
        .and_then(|wdata| Some((wdata, PackedConv::padded(&geo, og, false, cx.opts.micro)?)));
    if let Some((wdata, probe)) = packed {
        // An unpadded 1×1 conv whose tiles call a micro-kernel reads the NCHW input
        // as it is: a tile's broadcasts walk one run of consecutive pixels per input
        // channel, which the routine's wide tiles amortize, and the channels-last
        // copy would cost as much time as the product saves.
        let unpadded_1x1 = kh == 1 && kw == 1 && a.pads == [0; 4];
        // (`reads_blocks_on_micro` let a partial last block through to pointwise convs
        // on a micro-kernel only)
        let partial_input = x_blocked && !c.is_multiple_of(CHANNEL_BLOCK);
        if let (true, Some(routine)) = (unpadded_1x1, probe.micro) {
            // A strided 1×1 conv reads every stride-th pixel: copied out first (a
            // fraction of the conv's time), the conv runs at stride 1.
            let x = if a.strides == [1, 1] {
                x
            } else {
                // (in blocks, a partial last block is copied whole)
                let stored = if x_blocked {
                    c.next_multiple_of(CHANNEL_BLOCK)
                } else {
                    c
                };
                let len = n * stored * oh * ow;
                let xs = cx.temp("subsampled", len);
                let (planes, unit) = if x_blocked {
                    (n * stored / CHANNEL_BLOCK, CHANNEL_BLOCK)
                } else {
                    (n * c, 1)
                };
                let k =
                    subsample_kernel(planes, unit, [h, w], a.strides, [oh, ow], cx.len_of(x), len);
                cx.step(k, vec![x, xs])?;
                xs
            };
            // Input in blocks with a partial last block: the reduction walks whole blocks,
            // the padded channels (zeros, as every writer of blocks leaves them) against
            // weights the packer pads with zeros. (Ungrouped: the layout pass puts no
            // grouped conv's input in blocks.)
            let source_cg = geo.cg;
            let [c_read, cg_read] = if partial_input {
                [c.next_multiple_of(CHANNEL_BLOCK); 2]
            } else {
                [c, geo.cg]
            };
            let mut geo1 = Geo {
                stride: [1, 1],
                hp: oh,
                phases: 1,
                wq: ow,
                c: c_read,
                cg: cg_read,
                ..geo
            };
            let mut epi = epi;
            // At stride 1 an output pixel reads only the input pixel at the same
            // place, so the plane may be walked as rows of any length `k` dividing
            // it: rows of whole calls even at 14² and 7² (fewer calls, each weight
            // block read once per call). The longest such rows, unless they come in
            // an odd number: row bands are what threads share, and 7 bands split 4:3
            // over two cores where 8 split evenly (28² as 8 rows of 98, not 7 of 112).
            let plane = oh * ow;
            let k = (1..=2 * routine.max_pixels as usize)
                .filter(|k| plane.is_multiple_of(*k))
                .max_by_key(|&k| (plane / k == 1 || (plane / k).is_multiple_of(2), k))
                .unwrap_or(ow);
            if k != ow {
                if let Some(flat) = epi.with_plane_rows(ow, k) {
                    epi = flat;
                    geo1 = Geo {
                        oh: plane / k,
                        ow: k,
                        hp: plane / k,
                        wq: k,
                        ..geo1
                    };
                }
            }
            let micro = PackedConv::padded(&geo1, og, false, cx.opts.micro)
                .ok_or_else(|| cx.unsupported("a 1×1 conv's tiles on its plane's rows"))?
                .with_channel_blocks(x_blocked, out_blocked);
            let wbuf = cx.constant_later_from(
                wdata,
                micro.pack_recipe(&geo1, source_cg),
                ("w_packed", micro.packed_len(&geo1)),
                Box::new({
                    let (pack, g) = (micro.clone(), geo1.clone());
                    move |slab| pack.pack_from(&g, wdata, source_cg, slab)
                }),
            );
            return micro.kernel(cx, &geo1, x, wbuf, operands, epi, out);
        }
        let packed = PackedConv::padded(&geo, og, true, cx.opts.micro)
            .ok_or_else(|| cx.unsupported("a conv's packed tiles"))?
            .with_channel_blocks(false, out_blocked);
        let (pack, pack_geo) = (packed.clone(), geo.clone());
        let wbuf = cx.constant_later_from(
            wdata,
            packed.pack_recipe(&geo, geo.cg),
            ("w_packed", packed.packed_len(&geo)),
            Box::new(move |slab| pack.pack(&pack_geo, wdata, slab)),
        );
        let wp1 = w + pl + pr;
        // The packed kernel reads channels-last (NHWC) input: the input channels of
        // one pixel are consecutive, so a tile's loads walk a few contiguous runs
        // instead of one page per channel.
        let len = n * hp * wp1 * c;
        let xp = cx.temp("padded_nhwc", len);
        let src_len = cx.len_of(x);
        if pt > 0 || pb > 0 {
            let k = nhwc_border_kernel(n, c, [h, hp, wp1], pt, len);
            cx.step(k, vec![xp])?;
        }
        let k = nhwc_pad_kernel(n, c, x_blocked, [h, w], [pt, pl], [hp, wp1], src_len, len);
        cx.step(k, vec![x, xp])?;
        let geo1 = Geo {
            phases: 1,
            wq: wp1,
            ..geo
        };
        return packed.kernel(cx, &geo1, xp, wbuf, operands, epi, out);
    }
    let native_rows = depthwise::rows_apply(&geo, cx.opts.micro);
    if depthwise::applies(&geo, a.pads) && !native_rows {
        return depthwise::kernel(cx, &geo, x, operands, epi, out);
    }
    let xp = if a.pads == [0; 4] && sw == 1 {
        x
    } else {
        let len = n * c * hp * sw * geo.wq;
        let xp = cx.temp("padded", len);
        let k = pad_kernel(
            n * c,
            [h, w],
            [pt, pl],
            sw,
            [hp, geo.wq],
            0.0,
            cx.len_of(x),
            len,
        );
        cx.step(k, vec![x, xp])?;
        xp
    };
    if native_rows {
        return depthwise::rows_kernel(cx, &geo, xp, operands, epi, out);
    }
    conv_kernel(cx, &geo, xp, operands, epi, out)
}

/// The kernel arguments a convolution tile reads and writes.
struct TileBufs {
    x: BufId,
    w: BufId,
    bias: Option<BufId>,
    /// Whether every tile may read a whole tile's lanes of bias: there is none, or it is
    /// padded to whole tiles (a partial last block then reads its padding too).
    bias_whole_tiles: bool,
    out: BufId,
    /// Partial sums between input-channel parts (`[n][o/4][oh][ow][4]`), when split.
    partial: Option<BufId>,
}

impl TileBufs {
    /// Declares a conv kernel's arguments in their fixed order — input `x`, weights
    /// (`w_name`), the bias (`operands[2]`, if any), the epilogue's operands, `out` — and
    /// returns them with the buffers a step passes for them.
    #[allow(clippy::too_many_arguments)]
    fn declare(
        b: &mut KernelBuilder,
        cx: &Cx,
        xp: BufferId,
        w: (&str, BufferId),
        operands: &[Value],
        epi: &mut Epilogue,
        out: BufferId,
    ) -> (TileBufs, Vec<BufferId>) {
        let bias = operands.get(2).map(|&v| cx.buf(v));
        TileBufs::declare_with_bias(b, cx, xp, w, bias, epi, out)
    }

    /// [`TileBufs::declare`] with the bias read from `bias` (a padded copy of the
    /// operand's, say).
    #[allow(clippy::too_many_arguments)]
    fn declare_with_bias(
        b: &mut KernelBuilder,
        cx: &Cx,
        xp: BufferId,
        (w_name, wbuf): (&str, BufferId),
        bias: Option<BufferId>,
        epi: &mut Epilogue,
        out: BufferId,
    ) -> (TileBufs, Vec<BufferId>) {
        let x = b.arg("x", cx.len_of(xp), Access::Read);
        let w = b.arg(w_name, cx.len_of(wbuf), Access::Read);
        let mut args = vec![xp, wbuf];
        let bias = bias.map(|bb| {
            args.push(bb);
            b.arg("bias", cx.len_of(bb), Access::Read)
        });
        args.extend(epi.declare(b));
        let out_arg = b.arg("out", cx.len_of(out), Access::Write);
        args.push(out);
        let bufs = TileBufs {
            x,
            w,
            bias_whole_tiles: bias.is_none(),
            bias,
            out: out_arg,
            partial: None,
        };
        (bufs, args)
    }
}

/// Where a tile row starts: batch, first output channel, first input channel of the
/// group, output row.
struct TileAt {
    n: Affine,
    o0: Affine,
    c0: Affine,
    oh: Affine,
}

/// Transposes a 4×4 tile held in four vectors: lane `j` of result `i` is lane `i` of
/// input `j`. Eight two-input shuffles (unpack low/high of lanes, then of lane pairs),
/// each bound to a variable so no shuffle is emitted twice.
pub(super) fn transpose4(b: &mut KernelBuilder, rows: &[Expr]) -> Vec<Expr> {
    let w4 = Width::F32x4;
    let shuf = |b: &mut KernelBuilder, x: &Expr, y: &Expr, m: [u8; 4]| {
        b.let_(Expr::shuffle(x.clone(), y.clone(), m), w4)
    };
    // [r0.0, r1.0, r0.1, r1.1], [r2.0, r3.0, r2.1, r3.1], and the same for lanes 2, 3
    let lo01 = shuf(b, &rows[0], &rows[1], [0, 4, 1, 5]);
    let lo23 = shuf(b, &rows[2], &rows[3], [0, 4, 1, 5]);
    let hi01 = shuf(b, &rows[0], &rows[1], [2, 6, 3, 7]);
    let hi23 = shuf(b, &rows[2], &rows[3], [2, 6, 3, 7]);
    vec![
        shuf(b, &lo01, &lo23, [0, 1, 4, 5]),
        shuf(b, &lo01, &lo23, [2, 3, 6, 7]),
        shuf(b, &hi01, &hi23, [0, 1, 4, 5]),
        shuf(b, &hi01, &hi23, [2, 3, 6, 7]),
    ]
}
