//! When Winograd pays: the cost models of the direct and Winograd convolutions and the
//! form they choose.

use smelt_ir::loops::TileTarget;
use smelt_ir::op::Conv2dAttrs;
use smelt_ir::{Layout, TensorType, Value};

use super::Form;
use crate::lower::conv::{PackedConv, CHANNEL_BLOCKS};
use crate::lower::{ConvAlgorithm, Cx};

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

/// The most bytes of transformed input `V` that stay in the last-level cache between the
/// input transform and the product: half of a 32 MiB L3. A larger `V` is written to
/// memory and read back ([`v_streaming`]).
const V_BUDGET: usize = 16 << 20;

/// Cycles to write the transformed input `V` of `v_bytes` to memory and read it back,
/// when it outgrows [`V_BUDGET`]: both passes at the measured memory rate of one core
/// ([`WEIGHT_BYTES_PER_CYCLE`]). Measured at DBNet's 96 → 24 channels at 160² (F4's `V`
/// = 22 MB): on Zen 5 with AVX-512 Winograd took 6.8 ms against 6.5 direct; on Zen 3 with
/// AVX2, whose direct convolution has half the lanes, direct took 15.4 ms against ≈ 9
/// for Winograd at the same shape. The model gives direct on the first, Winograd on the
/// second.
fn v_streaming(v_bytes: usize) -> f64 {
    if v_bytes <= V_BUDGET {
        return 0.0;
    }
    2.0 * v_bytes as f64 / WEIGHT_BYTES_PER_CYCLE
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
/// costs ≈ 3×); `V`'s round trip through memory when it outgrows the cache
/// ([`v_streaming`]); and three more kernel calls.
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
    let v_bytes = a * a * c * (tiles as usize) * std::mem::size_of::<f32>();
    gemm.max(u / t.weight_bytes_per_cycle) + transforms + v_streaming(v_bytes) + 3.0 * CALL_CYCLES
}

/// The form the cost model picks, if Winograd applies at all: 3×3, stride 1, dilation 1,
/// one group, constant weights, row-major operands (the input and the result may be in
/// channel blocks on a micro-kernel), output channels a multiple of 4 (the
/// packed product's vectors; a partial block of a micro-kernel's lanes is padded), at
/// least 32 input and 16 output channels: smaller convolutions take microseconds either
/// way, and stay on the direct path that the thin-path tests and snapshots pin down.
pub(super) fn choose(
    cx: &Cx,
    a: &Conv2dAttrs,
    operands: &[Value],
    out_ty: &TensorType,
) -> Option<Form> {
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
    if !o.is_multiple_of(4) || c < 32 || o < 16 || oh < 4 || ow < 4 {
        return None;
    }
    // the product's channels on a micro-kernel: whole blocks of its lanes, the last
    // padded (the direct convolution's tiles are padded alike, so both models count
    // them); an input in channel blocks is read by the product's micro-kernel only
    let micro_o = PackedConv::micro_channels(o, cx.opts.micro);
    if xt.layout == CHANNEL_BLOCKS && micro_o.is_none() {
        return None;
    }
    let o = micro_o.unwrap_or(o);
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
