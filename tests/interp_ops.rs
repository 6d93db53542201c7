//! The reference interpreter, op by op, against hand-computed values and independent
//! formulations (im2col convolution, naive matmul), in every layout, with fused ops
//! checked against the unfused sequence and bad inputs checked to give errors.

use smelt_ir::builder::FuncBuilder;
use smelt_ir::interp::{self, eval_op};
use smelt_ir::op::{
    Conv2dAttrs, ConvTranspose2dAttrs, GeluApproximation, GemmAttrs, Pool2dAttrs, SliceAttrs,
};
use smelt_ir::weights::{random_f32, AlignedBuf, WeightOrigin, WeightStore};
use smelt_ir::{
    BinaryOp, ErrorStats, Func, FusedOp, Inst, Layout, Location, Module, Op, Param, PostOp, Tensor,
    TensorType, UnaryOp, Value, F32,
};

// ---------------------------------------------------------------- helpers

fn t(dims: &[usize], data: &[f32]) -> Tensor {
    Tensor::new(dims.to_vec(), data.to_vec()).expect("valid test tensor")
}

fn iota(dims: &[usize], start: f32) -> Tensor {
    let n: usize = dims.iter().product();
    t(dims, &(0..n).map(|i| start + i as f32).collect::<Vec<_>>())
}

fn random(dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product();
    t(dims, &random_f32(seed, n, -1.0, 1.0))
}

/// The op's result type by its type rule (operands carry their layouts).
fn result_type(op: &Op, operands: &[&Tensor]) -> TensorType {
    let types: Vec<&TensorType> = operands.iter().map(|t| &t.ty).collect();
    op.infer_type(&types, &|_| None)
        .expect("operands fit the op")
}

/// Evaluates `op` with the result type its type rule gives.
fn eval(op: Op, operands: &[&Tensor]) -> Tensor {
    let ty = result_type(&op, operands);
    eval_op(&op, operands, &ty, &WeightStore::new()).expect("op evaluates")
}

/// Asserts `got` equals `want` to a relative error (FACTS.md: max |diff| / max |want|).
fn assert_close(got: &Tensor, want: &[f64], tol: f64) {
    let got = got.f32s_row_major();
    assert_eq!(got.len(), want.len(), "element count");
    let want32: Vec<f32> = want.iter().map(|&v| v as f32).collect();
    let e = ErrorStats::between(&got, &want32);
    assert!(
        e.relative <= tol,
        "relative error {} > {tol}\n got {got:?}\nwant {want:?}",
        e.relative
    );
}

fn assert_exact(got: &Tensor, want: &[f32]) {
    assert_eq!(got.f32s_row_major(), want);
}

fn conv_op(strides: [usize; 2], pads: [usize; 4], dilations: [usize; 2], groups: usize) -> Op {
    Op::Conv2d(Conv2dAttrs {
        strides,
        pads,
        dilations,
        groups,
        ..Conv2dAttrs::default()
    })
}

fn pool(kernel: usize, stride: usize, pad: usize, ceil_mode: bool) -> Pool2dAttrs {
    Pool2dAttrs {
        kernel: [kernel; 2],
        strides: [stride; 2],
        pads: [pad; 4],
        dilations: [1, 1],
        ceil_mode,
        layout: smelt_ir::Layout::RowMajor,
    }
}

const NCHW4C: Layout = Layout::Blocked { axis: 1, block: 4 };
const OIHW4O: Layout = Layout::Blocked { axis: 0, block: 4 };

// ---------------------------------------------------------------- conv2d

#[test]
fn conv_hand_example_with_bias() {
    // out = x[y][x] - x[y+1][x+1] + 0.5 over the 3x3 grid 1..9
    let x = iota(&[1, 1, 3, 3], 1.0);
    let w = t(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, -1.0]);
    let b = t(&[1], &[0.5]);
    let y = eval(conv_op([1, 1], [0; 4], [1, 1], 1), &[&x, &w, &b]);
    assert_eq!(y.dims(), [1, 1, 2, 2]);
    assert_exact(&y, &[-3.5; 4]);
}

#[test]
fn conv_stride_2_with_asymmetric_pads() {
    // x = 1..16 in 4x4, pads top 1, right 1; taps w = [[1,2],[3,4]].
    // (0,0): only input row 0 is real: 1*3 + 2*4 = 11;  (0,1): 3*3 + 4*4 = 25
    // (1,0): 5 + 6*2 + 9*3 + 10*4 = 84;                (1,1): 7 + 8*2 + 11*3 + 12*4 = 104
    let x = iota(&[1, 1, 4, 4], 1.0);
    let w = t(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let y = eval(conv_op([2, 2], [1, 0, 0, 1], [1, 1], 1), &[&x, &w]);
    assert_eq!(y.dims(), [1, 1, 2, 2]);
    assert_exact(&y, &[11.0, 25.0, 84.0, 104.0]);
}

#[test]
fn conv_dilation_2() {
    // x[r][c] = 5r + c; taps at (0,0) and (2,2): out = x[y][x] + x[y+2][x+2] = 10y + 2x + 12
    let x = iota(&[1, 1, 5, 5], 0.0);
    let w = t(&[1, 1, 2, 2], &[1.0, 0.0, 0.0, 1.0]);
    let y = eval(conv_op([1, 1], [0; 4], [2, 2], 1), &[&x, &w]);
    assert_eq!(y.dims(), [1, 1, 3, 3]);
    let want: Vec<f32> = (0..3)
        .flat_map(|r| (0..3).map(move |c| (10 * r + 2 * c + 12) as f32))
        .collect();
    assert_exact(&y, &want);
}

#[test]
fn conv_groups_2_sums_only_within_group() {
    // channels [1,2 | 3,4]; out0 = 1*1 + 2*10, out1 = 3*100 + 4*1000
    let x = t(&[1, 4, 1, 1], &[1.0, 2.0, 3.0, 4.0]);
    let w = t(&[2, 2, 1, 1], &[1.0, 10.0, 100.0, 1000.0]);
    let y = eval(conv_op([1, 1], [0; 4], [1, 1], 2), &[&x, &w]);
    assert_exact(&y, &[21.0, 4300.0]);
}

#[test]
fn conv_depthwise_3x3_padded() {
    // channel 0: box sum of 1..9 with zero padding; channel 1: centre tap 2 → 2x.
    let x = t(
        &[1, 2, 3, 3],
        &(1..=9).chain(11..=19).map(|v| v as f32).collect::<Vec<_>>(),
    );
    let mut taps = vec![1.0; 9];
    taps.extend([0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0]);
    let w = t(&[2, 1, 3, 3], &taps);
    let y = eval(conv_op([1, 1], [1; 4], [1, 1], 2), &[&x, &w]);
    let mut want = vec![12.0, 21.0, 16.0, 27.0, 45.0, 33.0, 24.0, 39.0, 28.0];
    want.extend((11..=19).map(|v| 2.0 * v as f32));
    assert_exact(&y, &want);
}

/// Convolution as im2col + matrix product, straight from the definition.
fn conv_im2col(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, a: &Conv2dAttrs) -> Vec<f64> {
    let [n, h, wd] = [x.dims()[0], x.dims()[2], x.dims()[3]];
    let [o, cg, kh, kw] = [w.dims()[0], w.dims()[1], w.dims()[2], w.dims()[3]];
    let oh = (h + a.pads[0] + a.pads[2] - (a.dilations[0] * (kh - 1) + 1)) / a.strides[0] + 1;
    let ow = (wd + a.pads[1] + a.pads[3] - (a.dilations[1] * (kw - 1) + 1)) / a.strides[1] + 1;
    let og = o / a.groups;
    let rows = cg * kh * kw;
    let mut out = vec![0.0f64; n * o * oh * ow];
    for b in 0..n {
        for g in 0..a.groups {
            // columns[r][p]: the input under tap r for output pixel p (0 in the padding)
            let mut columns = vec![vec![0.0f64; oh * ow]; rows];
            for ci in 0..cg {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let r = (ci * kh + ky) * kw + kx;
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let iy = (oy * a.strides[0] + ky * a.dilations[0]) as i64
                                    - a.pads[0] as i64;
                                let ix = (ox * a.strides[1] + kx * a.dilations[1]) as i64
                                    - a.pads[1] as i64;
                                if iy >= 0 && ix >= 0 && (iy as usize) < h && (ix as usize) < wd {
                                    columns[r][oy * ow + ox] =
                                        (x.at(&[b, g * cg + ci, iy as usize, ix as usize]) as f32)
                                            as f64;
                                }
                            }
                        }
                    }
                }
            }
            for oi in 0..og {
                let oc = g * og + oi;
                for p in 0..oh * ow {
                    let mut s = bias.map_or(0.0, |bv| bv.f32s()[oc] as f64);
                    for (r, col) in columns.iter().enumerate() {
                        s += w.f32s()[oc * rows + r] as f64 * col[p];
                    }
                    out[(b * o + oc) * oh * ow + p] = s;
                }
            }
        }
    }
    out
}

#[test]
fn conv_matches_im2col_over_attribute_grid() {
    // (input dims, out channels, kernel, strides, pads, dilations, groups, bias)
    type Case = (
        [usize; 4],
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 4],
        [usize; 2],
        usize,
        bool,
    );
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ([1, 3, 7, 7],   4, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, true),
        ([2, 4, 9, 8],   6, [3, 3], [2, 2], [1, 0, 2, 1], [1, 1], 2, false),
        ([1, 2, 10, 11], 3, [3, 2], [1, 2], [0, 2, 1, 0], [2, 3], 1, true),
        ([1, 6, 8, 8],   6, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 6, true),  // depthwise
        ([1, 4, 9, 9],   8, [3, 3], [2, 2], [1, 1, 1, 1], [2, 2], 4, false),
        ([1, 8, 5, 5],  16, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 1, true),  // 1x1
        ([1, 8, 7, 7],   4, [1, 1], [2, 2], [0, 0, 0, 0], [1, 1], 1, false), // strided 1x1
        ([1, 3, 12, 12], 5, [7, 7], [2, 2], [3, 3, 3, 3], [1, 1], 1, true),  // stem-like
        ([1, 2, 4, 4],   2, [3, 3], [3, 3], [2, 2, 2, 2], [1, 1], 1, true),  // pad > stride
        ([1, 2, 3, 3],   2, [2, 2], [1, 1], [0, 0, 3, 3], [3, 3], 2, true),  // taps in end pad
        ([1, 3, 8, 6],   4, [3, 3], [2, 1], [1, 1, 1, 1], [1, 1], 1, true),  // stride H only
        ([1, 4, 6, 5],   2, [1, 1], [3, 1], [0, 0, 0, 0], [1, 1], 2, false), // 1x1, stride H only
        ([1, 2, 6, 7],   3, [2, 3], [1, 2], [1, 2, 0, 1], [1, 1], 1, true),  // stride W only
    ];
    for (i, &(xd, o, k, strides, pads, dilations, groups, with_bias)) in cases.iter().enumerate() {
        let attrs = Conv2dAttrs {
            strides,
            pads,
            dilations,
            groups,
            ..Conv2dAttrs::default()
        };
        let x = random(&xd, 100 + i as u64);
        let w = random(&[o, xd[1] / groups, k[0], k[1]], 200 + i as u64);
        let b = random(&[o], 300 + i as u64);
        let mut operands = vec![&x, &w];
        if with_bias {
            operands.push(&b);
        }
        let got = eval(Op::Conv2d(attrs.clone()), &operands);
        let want = conv_im2col(&x, &w, with_bias.then_some(&b), &attrs);
        assert_close(&got, &want, 1e-6);
        assert!(
            got.f32s().iter().any(|&v| v != 0.0),
            "case {i} is not trivial"
        );
    }
}

#[test]
fn conv_transpose_hand_example_stride_2_crops_and_pads_the_output() {
    // each input pixel stamps its value times the 2x2 taps [[1, 10], [100, 1000]] onto
    // its own 2x2 block of a 4x4 result; pads [1, 0, 0, 1] drop its first row and last
    // column, output padding [1, 0] adds a row of bias below
    let x = t(&[1, 1, 2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let w = t(&[1, 1, 2, 2], &[1.0, 10.0, 100.0, 1000.0]);
    let b = t(&[1], &[0.5]);
    let op = Op::ConvTranspose2d(ConvTranspose2dAttrs {
        strides: [2, 2],
        pads: [1, 0, 0, 1],
        output_padding: [1, 0],
        ..ConvTranspose2dAttrs::default()
    });
    let y = eval(op, &[&x, &w, &b]);
    assert_eq!(y.dims(), [1, 1, 4, 3]);
    #[rustfmt::skip]
    let want = [
        100.5, 1000.5, 200.5,
        3.5,   30.5,   4.5,
        300.5, 3000.5, 400.5,
        0.5,   0.5,    0.5,
    ];
    assert_exact(&y, &want);
}

/// The transposed convolution as an ordinary one: `x` with `stride - 1` zeros between
/// its pixels, padded by `dilation * (k - 1) - pad` (plus the output padding at the end),
/// convolved at stride 1 with the weights flipped and their two channel axes swapped.
fn conv_transpose_as_conv(
    x: &Tensor,
    w: &Tensor,
    bias: Option<&Tensor>,
    a: &ConvTranspose2dAttrs,
) -> Vec<f64> {
    let [n, c, h, wd] = [x.dims()[0], x.dims()[1], x.dims()[2], x.dims()[3]];
    let [_, og, kh, kw] = [w.dims()[0], w.dims()[1], w.dims()[2], w.dims()[3]];
    let [sh, sw] = a.strides;
    let (zh, zw) = ((h - 1) * sh + 1, (wd - 1) * sw + 1);
    let mut zeros = vec![0.0f32; n * c * zh * zw];
    let xs = x.f32s_row_major();
    for (p, plane) in zeros.chunks_mut(zh * zw).enumerate() {
        for iy in 0..h {
            for ix in 0..wd {
                plane[iy * sh * zw + ix * sw] = xs[(p * h + iy) * wd + ix];
            }
        }
    }
    let cg = c / a.groups;
    let ws = w.f32s_row_major();
    let mut flipped = vec![0.0f32; og * a.groups * cg * kh * kw];
    for g in 0..a.groups {
        for o in 0..og {
            for ci in 0..cg {
                for ky in 0..kh {
                    for kx in 0..kw {
                        let src = (((g * cg + ci) * og + o) * kh + ky) * kw + kx;
                        let dst =
                            ((((g * og + o) * cg + ci) * kh) + kh - 1 - ky) * kw + kw - 1 - kx;
                        flipped[dst] = ws[src];
                    }
                }
            }
        }
    }
    let span = |i: usize, k: usize| a.dilations[i] * (k - 1);
    let conv = Conv2dAttrs {
        strides: [1, 1],
        pads: [
            span(0, kh) - a.pads[0],
            span(1, kw) - a.pads[1],
            span(0, kh) - a.pads[2] + a.output_padding[0],
            span(1, kw) - a.pads[3] + a.output_padding[1],
        ],
        dilations: a.dilations,
        groups: a.groups,
        ..Conv2dAttrs::default()
    };
    let zx = t(&[n, c, zh, zw], &zeros);
    let fw = t(&[og * a.groups, cg, kh, kw], &flipped);
    conv_im2col(&zx, &fw, bias, &conv)
}

#[test]
fn conv_transpose_matches_the_zero_inserted_conv_over_attribute_grid() {
    // (input dims, out channels per group, kernel, strides, pads, dilations, groups,
    // output padding); pads at most dilation * (k - 1), which the equivalent conv needs
    type Case = (
        [usize; 4],
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 4],
        [usize; 2],
        usize,
        [usize; 2],
    );
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ([1, 3, 5, 5],  2, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, [0, 0]),
        ([2, 4, 4, 5],  3, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0]),
        ([1, 4, 3, 4],  2, [3, 3], [2, 3], [1, 0, 2, 1], [1, 1], 2, [1, 2]),
        ([1, 6, 4, 4],  1, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 6, [1, 1]),
        ([1, 2, 5, 3],  2, [3, 2], [1, 2], [2, 0, 1, 1], [2, 3], 1, [0, 1]),
        ([1, 3, 2, 2],  4, [4, 4], [3, 3], [1, 2, 3, 0], [1, 1], 1, [2, 0]),
    ];
    for (i, &(xd, og, k, strides, pads, dilations, groups, output_padding)) in
        cases.iter().enumerate()
    {
        let attrs = ConvTranspose2dAttrs {
            strides,
            pads,
            dilations,
            groups,
            output_padding,
        };
        let x = random(&xd, 400 + i as u64);
        let w = random(&[xd[1], og, k[0], k[1]], 500 + i as u64);
        let b = random(&[og * groups], 600 + i as u64);
        let with_bias = i % 2 == 0;
        let mut operands = vec![&x, &w];
        if with_bias {
            operands.push(&b);
        }
        let got = eval(Op::ConvTranspose2d(attrs.clone()), &operands);
        let want = conv_transpose_as_conv(&x, &w, with_bias.then_some(&b), &attrs);
        assert_close(&got, &want, 1e-6);
        assert!(
            got.f32s().iter().any(|&v| v != 0.0),
            "case {i} is not trivial"
        );
    }
}

#[test]
fn conv_reads_blocked_operands_and_writes_blocked_result() {
    let attrs = Conv2dAttrs {
        pads: [1; 4],
        ..Conv2dAttrs::default()
    };
    let x = random(&[2, 5, 6, 6], 1);
    let w = random(&[6, 5, 3, 3], 2);
    let plain = eval(Op::Conv2d(attrs.clone()), &[&x, &w]);
    let xb = x.to_layout(NCHW4C);
    let wb = w.to_layout(OIHW4O);
    let op = Op::Conv2d(attrs);
    let ty = result_type(&op, &[&xb, &wb]).with_layout(NCHW4C);
    let blocked = eval_op(&op, &[&xb, &wb], &ty, &WeightStore::new()).unwrap();
    assert_eq!(blocked.ty, ty);
    assert_eq!(blocked.data.len(), 2 * 2 * 36 * 4);
    assert_eq!(blocked.f32s_row_major(), plain.data);
    // the padding lanes (channels 6 and 7) are zero
    for n in 0..2 {
        for pixel in 0..36 {
            let base = ((n * 2 + 1) * 36 + pixel) * 4;
            assert_eq!(&blocked.f32s()[base + 2..base + 4], &[0.0, 0.0]);
        }
    }
}

// ---------------------------------------------------------------- batch norm and folding

#[test]
fn batch_norm_hand_example() {
    // ch0: (x - 1) / 2;  ch1: (x - 3) / 0.5 * 2 + 1
    let x = t(&[1, 2, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    let p = |v: [f32; 2]| t(&[2], &v);
    let (scale, bias, mean, var) = (p([1.0, 2.0]), p([0.0, 1.0]), p([1.0, 3.0]), p([4.0, 0.25]));
    let y = eval(
        Op::BatchNorm { epsilon: F32(0.0) },
        &[&x, &scale, &bias, &mean, &var],
    );
    assert_exact(&y, &[0.0, 0.5, 1.0, 5.0]);
}

#[test]
fn batch_norm_applies_epsilon_on_rank_2() {
    let x = t(&[2, 1], &[3.0, 5.0]);
    let one = t(&[1], &[1.0]);
    let zero = t(&[1], &[0.0]);
    let var = t(&[1], &[0.0]);
    let y = eval(
        Op::BatchNorm { epsilon: F32(0.25) },
        &[&x, &one, &zero, &zero, &var],
    );
    assert_exact(&y, &[6.0, 10.0]); // / sqrt(0.25)
}

#[test]
fn bn_fold_weight_and_bias_hand_example() {
    // alpha = scale / sqrt(var + eps) = [2 / 2, 3 / 0.5] = [1, 6]
    let w = t(&[2, 1, 1, 2], &[1.0, 2.0, 3.0, 4.0]);
    let scale = t(&[2], &[2.0, 3.0]);
    let bias = t(&[2], &[0.5, -1.0]);
    let mean = t(&[2], &[1.0, 2.0]);
    let var = t(&[2], &[4.0, 0.25]);
    let eps = F32(0.0);
    let wf = eval(Op::BnFoldWeight { epsilon: eps }, &[&w, &scale, &var]);
    assert_exact(&wf, &[1.0, 2.0, 18.0, 24.0]);
    let bf = eval(
        Op::BnFoldBias { epsilon: eps },
        &[&scale, &bias, &mean, &var],
    );
    // (0 - mean) * alpha + bias
    assert_exact(&bf, &[-0.5, -13.0]);
    let conv_bias = t(&[2], &[3.0, 1.0]);
    let bf = eval(
        Op::BnFoldBias { epsilon: eps },
        &[&scale, &bias, &mean, &var, &conv_bias],
    );
    assert_exact(&bf, &[2.5, -7.0]);
}

#[test]
fn folded_conv_equals_conv_then_batch_norm() {
    for with_conv_bias in [false, true] {
        let attrs = Conv2dAttrs {
            strides: [2, 1],
            pads: [1, 0, 1, 2],
            ..Conv2dAttrs::default()
        };
        let x = random(&[1, 3, 9, 9], 11);
        let w = random(&[8, 3, 3, 3], 12);
        let conv_bias = random(&[8], 13);
        let scale = random(&[8], 14);
        let bias = random(&[8], 15);
        let mean = random(&[8], 16);
        let var = t(&[8], &random_f32(17, 8, 0.1, 2.0));
        let eps = F32(1e-5);
        let mut conv_operands = vec![&x, &w];
        let mut bias_operands = vec![&scale, &bias, &mean, &var];
        if with_conv_bias {
            conv_operands.push(&conv_bias);
            bias_operands.push(&conv_bias);
        }
        let conv = eval(Op::Conv2d(attrs.clone()), &conv_operands);
        let reference = eval(
            Op::BatchNorm { epsilon: eps },
            &[&conv, &scale, &bias, &mean, &var],
        );
        let wf = eval(Op::BnFoldWeight { epsilon: eps }, &[&w, &scale, &var]);
        let bf = eval(Op::BnFoldBias { epsilon: eps }, &bias_operands);
        let folded = eval(Op::Conv2d(attrs), &[&x, &wf, &bf]);
        let e = ErrorStats::between_tensors(&folded, &reference).unwrap();
        assert!(e.relative <= 1e-6, "conv bias {with_conv_bias}: {e:?}");
    }
}

// ---------------------------------------------------------------- elementwise

#[test]
fn binary_ops_hand_values() {
    let a = t(&[4], &[1.0, -2.0, 6.0, 0.5]);
    let b = t(&[4], &[4.0, 3.0, -2.0, 0.5]);
    let cases = [
        (BinaryOp::Add, [5.0, 1.0, 4.0, 1.0]),
        (BinaryOp::Sub, [-3.0, -5.0, 8.0, 0.0]),
        (BinaryOp::Mul, [4.0, -6.0, -12.0, 0.25]),
        (BinaryOp::Div, [0.25, -2.0 / 3.0, -3.0, 1.0]),
        (BinaryOp::Min, [1.0, -2.0, -2.0, 0.5]),
        (BinaryOp::Max, [4.0, 3.0, 6.0, 0.5]),
        // a where a >= 0, else b * a
        (BinaryOp::PRelu, [1.0, -6.0, 6.0, 0.5]),
    ];
    for (op, want) in cases {
        assert_exact(&eval(Op::Binary(op), &[&a, &b]), &want);
    }
}

#[test]
fn binary_broadcasts_scalar_channel_and_rank_mismatch() {
    // scalar (rank 0) on the right and on the left
    let x = iota(&[2, 2], 1.0);
    let s = t(&[], &[10.0]);
    assert_exact(
        &eval(Op::Binary(BinaryOp::Sub), &[&x, &s]),
        &[-9.0, -8.0, -7.0, -6.0],
    );
    assert_exact(
        &eval(Op::Binary(BinaryOp::Sub), &[&s, &x]),
        &[9.0, 8.0, 7.0, 6.0],
    );
    // per-channel [C,1,1] against [1,C,H,W]
    let x = iota(&[1, 2, 2, 2], 0.0);
    let c = t(&[2, 1, 1], &[100.0, 200.0]);
    let y = eval(Op::Binary(BinaryOp::Add), &[&x, &c]);
    assert_eq!(y.dims(), [1, 2, 2, 2]);
    assert_exact(
        &y,
        &[100.0, 101.0, 102.0, 103.0, 204.0, 205.0, 206.0, 207.0],
    );
    // rank mismatch [3] with [2,3], and an outer product [2,1] x [1,3]
    let row = t(&[3], &[1.0, 2.0, 3.0]);
    let m = iota(&[2, 3], 0.0);
    assert_exact(
        &eval(Op::Binary(BinaryOp::Mul), &[&m, &row]),
        &[0.0, 2.0, 6.0, 3.0, 8.0, 15.0],
    );
    let col = t(&[2, 1], &[10.0, 20.0]);
    let row2 = t(&[1, 3], &[1.0, 2.0, 3.0]);
    let y = eval(Op::Binary(BinaryOp::Add), &[&col, &row2]);
    assert_eq!(y.dims(), [2, 3]);
    assert_exact(&y, &[11.0, 12.0, 13.0, 21.0, 22.0, 23.0]);
}

#[test]
fn every_unary_matches_closed_forms() {
    let ln2 = std::f64::consts::LN_2;
    let ln3 = 3f64.ln();
    let erf1 = 0.842_700_792_949_714_9; // erf(1)
    let erf_1_sqrt2 = 0.682_689_492_137_085_9; // erf(1/sqrt 2)
    let cases: Vec<(UnaryOp, Vec<f64>, Vec<f64>)> = vec![
        (UnaryOp::Relu, vec![-1.0, 0.0, 2.5], vec![0.0, 0.0, 2.5]),
        (
            UnaryOp::Clip {
                min: F32(0.0),
                max: F32(6.0),
            },
            vec![-1.0, 3.0, 7.0],
            vec![0.0, 3.0, 6.0],
        ),
        (
            UnaryOp::LeakyRelu { alpha: F32(0.125) },
            vec![-2.0, 0.0, 3.0],
            vec![-0.25, 0.0, 3.0],
        ),
        (
            UnaryOp::Sigmoid,
            vec![0.0, ln3, -ln3],
            vec![0.5, 0.75, 0.25],
        ),
        (UnaryOp::Tanh, vec![0.0, ln2, -ln2], vec![0.0, 0.6, -0.6]),
        (
            UnaryOp::Erf,
            vec![0.0, 1.0, -1.0, 10.0],
            vec![0.0, erf1, -erf1, 1.0],
        ),
        (
            UnaryOp::Gelu {
                approximate: GeluApproximation::Tanh,
            },
            vec![0.0, 1.0, -1.0, 3.0],
            // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) by Python's math module
            vec![
                0.0,
                0.841_191_990_608_276_8,
                -0.158_808_009_391_723_24,
                2.996_362_607_918_227,
            ],
        ),
        (
            UnaryOp::Mish,
            vec![0.0, 1.0, -1.0, -20.0, 30.0],
            // x tanh(log1p(exp(x))) by Python's math module
            vec![
                0.0,
                0.865_098_388_267_310_3,
                -0.303_401_461_374_108_95,
                -4.122_307_240_628_762e-8,
                30.0,
            ],
        ),
        (
            UnaryOp::Gelu {
                approximate: GeluApproximation::None,
            },
            vec![0.0, 1.0, -1.0, 10.0],
            vec![
                0.0,
                0.5 * (1.0 + erf_1_sqrt2),
                -0.5 * (1.0 - erf_1_sqrt2),
                10.0,
            ],
        ),
        (
            UnaryOp::HardSigmoid {
                alpha: F32(0.25),
                beta: F32(0.5),
            },
            vec![-10.0, 1.0, 10.0],
            vec![0.0, 0.75, 1.0],
        ),
        (
            UnaryOp::HardSwish,
            vec![-3.0, 1.0, 3.0, 4.0],
            vec![0.0, 2.0 / 3.0, 3.0, 4.0],
        ),
        (
            UnaryOp::Silu,
            vec![0.0, ln3, -ln3],
            vec![0.0, 0.75 * ln3, -0.25 * ln3],
        ),
        (UnaryOp::Neg, vec![-2.0, 0.0, 3.5], vec![2.0, 0.0, -3.5]),
        (UnaryOp::Abs, vec![-2.0, 0.0, 3.5], vec![2.0, 0.0, 3.5]),
        (UnaryOp::Sqrt, vec![0.0, 2.25, 16.0], vec![0.0, 1.5, 4.0]),
        (UnaryOp::Exp, vec![0.0, ln2, -ln2], vec![1.0, 2.0, 0.5]),
        (
            UnaryOp::Reciprocal,
            vec![-4.0, 0.5, 8.0],
            vec![-0.25, 2.0, 0.125],
        ),
    ];
    for (u, xs, want) in cases {
        let x = t(
            &[xs.len()],
            &xs.iter().map(|&v| v as f32).collect::<Vec<_>>(),
        );
        let y = eval(Op::Unary(u), &[&x]);
        for ((&g, &w), &xv) in y.f32s().iter().zip(&want).zip(&xs) {
            assert!(
                (g as f64 - w).abs() <= 1e-6 * w.abs().max(1.0),
                "{}({xv}) = {g}, want {w}",
                u.name()
            );
        }
    }
}

#[test]
fn nan_and_infinity_propagate_without_panics() {
    let x = t(&[1, 1, 2, 2], &[f32::NAN, 1.0, f32::INFINITY, -1.0]);
    let y = eval(Op::Unary(UnaryOp::Sigmoid), &[&x]);
    assert!(y.f32s()[0].is_nan());
    assert_eq!(y.f32s()[2], 1.0);
    // 1x1 conv with weight 2: NaN stays at its pixel, infinity stays infinite
    let w = t(&[1, 1, 1, 1], &[2.0]);
    let y = eval(Op::Conv2d(Conv2dAttrs::default()), &[&x, &w]);
    assert!(y.f32s()[0].is_nan());
    assert_eq!(&y.f32s()[1..], &[2.0, f32::INFINITY, -2.0]);
    // max pool over the whole 2x2 propagates the NaN
    let y = eval(Op::MaxPool2d(pool(2, 1, 0, false)), &[&x]);
    assert!(y.f32s()[0].is_nan());
    // softmax over a row with +inf: inf - inf is NaN, so the sum and every output are NaN
    let s = eval(
        Op::Softmax { axis: 1 },
        &[&t(&[1, 2], &[f32::INFINITY, 0.0])],
    );
    assert!(s.f32s().iter().all(|v| v.is_nan()));
    // -inf alone is fine: it gets probability 0
    let s = eval(
        Op::Softmax { axis: 1 },
        &[&t(&[1, 2], &[f32::NEG_INFINITY, 0.0])],
    );
    assert_eq!(s.data, vec![0.0, 1.0]);
}

// ---------------------------------------------------------------- norms

#[test]
fn layer_norm_hand_example() {
    // row [1,2,3,4]: mean 2.5, biased var 1.25; row [5,5,5,5]: var 0 → 0 (+ bias)
    let x = t(&[2, 4], &[1.0, 2.0, 3.0, 4.0, 5.0, 5.0, 5.0, 5.0]);
    let scale = t(&[4], &[1.0, 1.0, 2.0, 2.0]);
    let bias = t(&[4], &[0.0, 0.0, 0.0, 1.0]);
    let eps = 1e-5f32;
    let y = eval(
        Op::LayerNorm {
            axis: 1,
            epsilon: F32(eps),
        },
        &[&x, &scale, &bias],
    );
    let s = (1.25f64 + eps as f64).sqrt();
    let want = [
        -1.5 / s,
        -0.5 / s,
        2.0 * 0.5 / s,
        2.0 * 1.5 / s + 1.0,
        0.0,
        0.0,
        0.0,
        1.0,
    ];
    assert_close(&y, &want, 1e-6);
}

#[test]
fn layer_norm_over_two_trailing_axes_without_bias() {
    // x [2, 2, 2], normalized over the last two axes: each [2,2] block → standard scores
    let x = t(&[2, 2, 2], &[0.0, 2.0, 4.0, 6.0, -1.0, -1.0, 1.0, 1.0]);
    let scale = t(&[2, 2], &[1.0; 4]);
    let y = eval(
        Op::LayerNorm {
            axis: 1,
            epsilon: F32(0.0),
        },
        &[&x, &scale],
    );
    // block 1: mean 3, var 5; block 2: mean 0, var 1
    let r5 = 5f64.sqrt();
    assert_close(
        &y,
        &[
            -3.0 / r5,
            -1.0 / r5,
            1.0 / r5,
            3.0 / r5,
            -1.0,
            -1.0,
            1.0,
            1.0,
        ],
        1e-6,
    );
}

#[test]
fn softmax_hand_example_rows_sum_to_one_and_is_stable() {
    let ln2 = std::f32::consts::LN_2;
    let ln3 = 3f32.ln();
    let x = t(&[2, 3], &[0.0, ln2, ln3, 1000.0, 1000.0, 1000.0]);
    let y = eval(Op::Softmax { axis: 1 }, &[&x]);
    assert_close(
        &y,
        &[
            1.0 / 6.0,
            2.0 / 6.0,
            3.0 / 6.0,
            1.0 / 3.0,
            1.0 / 3.0,
            1.0 / 3.0,
        ],
        1e-6,
    );
    // along axis 0 of a [2, 2]: columns sum to one; 1000 vs 1001 stays finite
    let x = t(&[2, 2], &[1000.0, 0.0, 1001.0, 0.0]);
    let y = eval(Op::Softmax { axis: 0 }, &[&x]);
    let e = std::f64::consts::E;
    assert_close(&y, &[1.0 / (1.0 + e), 0.5, e / (1.0 + e), 0.5], 1e-6);
    let x = random(&[3, 5, 4], 9);
    let y = eval(Op::Softmax { axis: 1 }, &[&x]);
    for o in 0..3 {
        for i in 0..4 {
            let sum: f64 = (0..5).map(|k| (y.at(&[o, k, i]) as f32) as f64).sum();
            assert!((sum - 1.0).abs() < 1e-6, "sum {sum}");
        }
    }
}

// ---------------------------------------------------------------- pools

/// The 4x4 grid 1..16 as NCHW.
fn grid() -> Tensor {
    iota(&[1, 1, 4, 4], 1.0)
}

#[test]
fn max_pool_padding_never_wins() {
    let neg = t(
        &[1, 1, 4, 4],
        &(1..=16).map(|v| -(v as f32)).collect::<Vec<_>>(),
    );
    let y = eval(Op::MaxPool2d(pool(3, 2, 1, false)), &[&neg]);
    assert_eq!(y.dims(), [1, 1, 2, 2]);
    assert_exact(&y, &[-1.0, -2.0, -5.0, -6.0]);
    let y = eval(Op::MaxPool2d(pool(3, 2, 1, false)), &[&grid()]);
    assert_exact(&y, &[6.0, 8.0, 14.0, 16.0]);
}

#[test]
fn max_pool_ceil_mode_adds_a_clipped_last_window() {
    let y = eval(Op::MaxPool2d(pool(3, 2, 1, true)), &[&grid()]);
    assert_eq!(y.dims(), [1, 1, 3, 3]);
    assert_exact(&y, &[6.0, 8.0, 8.0, 14.0, 16.0, 16.0, 14.0, 16.0, 16.0]);
}

#[test]
fn max_pool_dilation_2() {
    let p = Pool2dAttrs {
        dilations: [2, 2],
        ..pool(2, 1, 0, false)
    };
    let y = eval(Op::MaxPool2d(p), &[&grid()]);
    assert_exact(&y, &[11.0, 12.0, 15.0, 16.0]);
}

#[test]
fn avg_pool_count_include_pad_both_ways() {
    let avg = |p: Pool2dAttrs, include: bool| {
        eval(
            Op::AvgPool2d {
                pool: p,
                count_include_pad: include,
            },
            &[&grid()],
        )
    };
    // window sums: 14, 30, 57, 99 over 4, 6, 6, 9 real elements
    assert_close(
        &avg(pool(3, 2, 1, false), true),
        &[14.0 / 9.0, 30.0 / 9.0, 57.0 / 9.0, 11.0],
        1e-7,
    );
    assert_close(
        &avg(pool(3, 2, 1, false), false),
        &[3.5, 5.0, 9.5, 11.0],
        1e-7,
    );
}

#[test]
fn avg_pool_ceil_mode_clips_windows_to_the_padded_extent() {
    let avg = |include: bool| {
        eval(
            Op::AvgPool2d {
                pool: pool(3, 2, 1, true),
                count_include_pad: include,
            },
            &[&grid()],
        )
    };
    // last windows cover padded rows/cols 3, 4, 5: position 5 is past the end pad, so
    // with count_include_pad they divide by 2 taps per clipped axis, not 3.
    assert_close(
        &avg(true),
        &[
            14.0 / 9.0,
            30.0 / 9.0,
            12.0 / 6.0,
            57.0 / 9.0,
            99.0 / 9.0,
            36.0 / 6.0,
            27.0 / 6.0,
            45.0 / 6.0,
            16.0 / 4.0,
        ],
        1e-7,
    );
    assert_close(
        &avg(false),
        &[3.5, 5.0, 6.0, 9.5, 11.0, 12.0, 13.5, 15.0, 16.0],
        1e-7,
    );
}

#[test]
fn global_avg_pool_means_each_plane() {
    let x = iota(&[2, 2, 2, 2], 0.0);
    let y = eval(Op::GlobalAvgPool, &[&x]);
    assert_eq!(y.dims(), [2, 2, 1, 1]);
    assert_exact(&y, &[1.5, 5.5, 9.5, 13.5]);
}

// ---------------------------------------------------------------- shapes

#[test]
fn flatten_reshape_transpose_concat() {
    let x = iota(&[2, 3, 2], 0.0);
    let f = eval(Op::Flatten { axis: 1 }, &[&x]);
    assert_eq!(f.dims(), [2, 6]);
    assert_eq!(f.data, x.data);
    let f0 = eval(Op::Flatten { axis: 0 }, &[&x]);
    assert_eq!(f0.dims(), [1, 12]);
    let r = eval(Op::Reshape { shape: vec![3, 4] }, &[&x]);
    assert_eq!(r.dims(), [3, 4]);
    assert_eq!(r.data, x.data);

    let m = iota(&[2, 3], 0.0);
    let mt = eval(Op::Transpose { perm: vec![1, 0] }, &[&m]);
    assert_eq!(mt.dims(), [3, 2]);
    assert_exact(&mt, &[0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    let perm = vec![2, 0, 1];
    let y = eval(Op::Transpose { perm: perm.clone() }, &[&x]);
    assert_eq!(y.dims(), [2, 2, 3]);
    for i in 0..2 {
        for j in 0..3 {
            for k in 0..2 {
                assert_eq!((y.at(&[k, i, j]) as f32), (x.at(&[i, j, k]) as f32));
            }
        }
    }

    let a = iota(&[2, 2], 0.0);
    let b = iota(&[2, 1], 10.0);
    let c = eval(Op::Concat { axis: 1 }, &[&a, &b, &a]);
    assert_eq!(c.dims(), [2, 5]);
    assert_exact(&c, &[0.0, 1.0, 10.0, 0.0, 1.0, 2.0, 3.0, 11.0, 2.0, 3.0]);
    let c = eval(Op::Concat { axis: 0 }, &[&a, &iota(&[1, 2], 7.0)]);
    assert_exact(&c, &[0.0, 1.0, 2.0, 3.0, 7.0, 8.0]);
}

// ---------------------------------------------------------------- matmul and gemm

/// Naive numpy matmul for the shapes used below, indexing through broadcast rules.
fn naive_matmul(a: &Tensor, b: &Tensor, out_dims: &[usize]) -> Vec<f64> {
    let k = *a.dims().last().unwrap();
    let rank = out_dims.len();
    let n_out: usize = out_dims.iter().product();
    let mut out = Vec::with_capacity(n_out);
    let mut idx = vec![0usize; rank];
    for _ in 0..n_out {
        let (i, j) = (idx[rank - 2], idx[rank - 1]);
        let batch = &idx[..rank - 2];
        let pick = |t: &Tensor, row: usize, col: usize| {
            let lead = rank - t.dims().len();
            let mut at: Vec<usize> = (lead..rank - 2)
                .map(|d| if t.dims()[d - lead] == 1 { 0 } else { batch[d] })
                .collect();
            at.extend([row, col]);
            t.at(&at)
        };
        out.push((0..k).map(|p| pick(a, i, p) * pick(b, p, j)).sum());
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < out_dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

#[test]
fn matmul_2d_hand_example_and_vector_promotion() {
    let a = iota(&[2, 3], 1.0); // [[1,2,3],[4,5,6]]
    let b = t(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]);
    assert_exact(&eval(Op::MatMul, &[&a, &b]), &[4.0, 5.0, 10.0, 11.0]);
    // vector @ matrix → [2]; matrix @ vector → [2]; vector @ vector → scalar
    let v3 = t(&[3], &[1.0, 1.0, 2.0]);
    let v2 = t(&[2], &[1.0, -1.0]);
    let y = eval(Op::MatMul, &[&v2, &a]);
    assert_eq!(y.dims(), [3]);
    assert_exact(&y, &[-3.0, -3.0, -3.0]);
    let y = eval(Op::MatMul, &[&a, &v3]);
    assert_eq!(y.dims(), [2]);
    assert_exact(&y, &[9.0, 21.0]);
    let y = eval(Op::MatMul, &[&v3, &v3]);
    assert_eq!(y.dims(), [] as [usize; 0]);
    assert_exact(&y, &[6.0]);
}

#[test]
fn matmul_batched_with_broadcasting_matches_naive() {
    for (i, (ad, bd)) in [
        (vec![2, 1, 2, 3], vec![3, 3, 4]),
        (vec![3, 2, 5], vec![5, 2]),
        (vec![4, 3], vec![2, 1, 3, 2]),
        (vec![2, 3, 4], vec![2, 4, 3]),
    ]
    .into_iter()
    .enumerate()
    {
        let a = random(&ad, 40 + i as u64);
        let b = random(&bd, 50 + i as u64);
        let y = eval(Op::MatMul, &[&a, &b]);
        let want = naive_matmul(&a, &b, y.dims());
        assert_close(&y, &want, 1e-6);
    }
}

#[test]
fn gemm_all_transpose_combos_with_alpha_beta_and_c_broadcast() {
    let a = iota(&[2, 3], 1.0); // [[1,2,3],[4,5,6]]
    let b = t(&[3, 2], &[1.0, 0.0, 0.0, 1.0, 1.0, 1.0]); // A@B = [[4,5],[10,11]]
    let transpose = |x: &Tensor| eval(Op::Transpose { perm: vec![1, 0] }, &[x]);
    let c_row = t(&[2], &[10.0, 20.0]);
    let c_col = t(&[2, 1], &[10.0, 20.0]);
    let c_scalar = t(&[], &[4.0]);
    let c_full = t(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    let cases: [(Option<&Tensor>, [f32; 4]); 5] = [
        (Some(&c_row), [13.0, 20.0, 25.0, 32.0]),
        (Some(&c_col), [13.0, 15.0, 30.0, 32.0]),
        (Some(&c_scalar), [10.0, 12.0, 22.0, 24.0]),
        (Some(&c_full), [8.5, 11.0, 21.5, 24.0]),
        (None, [8.0, 10.0, 20.0, 22.0]),
    ];
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            let a_in = if trans_a { transpose(&a) } else { a.clone() };
            let b_in = if trans_b { transpose(&b) } else { b.clone() };
            for (c, want) in &cases {
                let op = Op::Gemm(GemmAttrs {
                    alpha: F32(2.0),
                    beta: F32(0.5),
                    trans_a,
                    trans_b,
                });
                let mut operands = vec![&a_in, &b_in];
                operands.extend(*c);
                let y = eval(op, &operands);
                assert_eq!(y.dims(), [2, 2]);
                assert_exact(&y, want);
            }
        }
    }
}

// ---------------------------------------------------------------- layouts

#[test]
fn reorder_round_trips_and_zero_pads() {
    let x = random(&[2, 5, 3, 2], 21);
    let to = |t: &Tensor, layout| eval(Op::Reorder { layout }, &[t]);
    let b = to(&x, NCHW4C);
    assert_eq!(b.ty.layout, NCHW4C);
    assert_eq!(b.data.len(), 2 * 2 * 3 * 2 * 4);
    // element (n, c, h, w) sits at [n][c / 4][h][w][c % 4] of storage [2, 2, 3, 2, 4]
    for (n, c, h, w) in [(1, 4, 2, 1), (0, 2, 1, 0), (1, 3, 0, 1)] {
        let offset = (((n * 2 + c / 4) * 3 + h) * 2 + w) * 4 + c % 4;
        assert_eq!(b.f32s()[offset], (x.at(&[n, c, h, w]) as f32));
    }
    for n in 0..2 {
        for pixel in 0..6 {
            let base = ((n * 2 + 1) * 6 + pixel) * 4;
            assert_eq!(
                &b.f32s()[base + 1..base + 4],
                &[0.0; 3],
                "channels 5..8 pad"
            );
        }
    }
    let back = to(&b, Layout::RowMajor);
    assert_eq!(back, x);

    let w = random(&[6, 3, 3, 3], 22);
    let wb = to(&w, OIHW4O);
    assert_eq!(wb.data.len(), 2 * 3 * 3 * 3 * 4);
    // element (o, i, h, w) sits at [o / 4][i][h][w][o % 4] of storage [2, 3, 3, 3, 4]
    for (o, i, h, w_) in [(5, 2, 1, 0), (3, 0, 2, 2)] {
        let offset = (((o / 4 * 3 + i) * 3 + h) * 3 + w_) * 4 + o % 4;
        assert_eq!(wb.f32s()[offset], (w.at(&[o, i, h, w_]) as f32));
    }
    assert_eq!(to(&wb, Layout::RowMajor), w);
    // blocked to another blocking directly
    let generic = Layout::Blocked { axis: 2, block: 2 };
    let g = to(&b, generic);
    assert_eq!(g.ty.layout, generic);
    assert_eq!(g.f32s_row_major(), x.data);
}

#[test]
fn elementwise_ops_accept_blocked_operands() {
    let x = random(&[1, 6, 2, 2], 31);
    let y = random(&[1, 6, 2, 2], 32);
    let plain = eval(Op::Binary(BinaryOp::Add), &[&x, &y]);
    let xb = x.to_layout(NCHW4C);
    let mixed = eval(Op::Binary(BinaryOp::Add), &[&xb, &y]);
    assert_eq!(mixed.ty.layout, Layout::RowMajor);
    assert_eq!(mixed.data, plain.data);
    let op = Op::Unary(UnaryOp::Relu);
    let ty = result_type(&op, &[&xb]).with_layout(NCHW4C);
    let relu_b = eval_op(&op, &[&xb], &ty, &WeightStore::new()).unwrap();
    assert_eq!(relu_b.ty.layout, NCHW4C);
    assert_eq!(
        relu_b.f32s_row_major(),
        eval(Op::Unary(UnaryOp::Relu), &[&x]).data
    );
}

// ---------------------------------------------------------------- const

#[test]
fn const_reads_weights_in_their_storage_order() {
    let mut store = WeightStore::new();
    let w = random(&[5, 2, 1, 1], 61);
    let packed = w.to_layout(OIHW4O);
    let id = store
        .add(
            "packed",
            packed.ty.clone(),
            AlignedBuf::from_f32(packed.f32s()),
            WeightOrigin::Computed,
        )
        .unwrap();
    let op = Op::Const(id);
    let y = eval_op(&op, &[], &packed.ty, &store).unwrap();
    assert_eq!(y, packed);
    // the same weight read as row-major gives the logical values
    let y = eval_op(&op, &[], &w.ty, &store).unwrap();
    assert_eq!(y, w);
    // an unknown weight is an error
    let bad = Op::Const(smelt_ir::WeightId(99));
    assert!(eval_op(&bad, &[], &w.ty, &store).is_err());
}

// ---------------------------------------------------------------- fused ops

/// Builds `@f(x, skip)`: one function doing conv → add(skip) → relu, either fused or not.
fn conv_add_relu(fused: bool, acc_is_lhs: bool) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", TensorType::f32([1, 3, 6, 6]));
    let skip = b.param("skip", TensorType::f32([1, 4, 3, 3]));
    let w = b
        .constant(
            "w",
            TensorType::f32([4, 3, 3, 3]),
            &random_f32(5, 108, -1.0, 1.0),
        )
        .unwrap();
    let bias = b
        .constant("b", TensorType::f32([4]), &random_f32(6, 4, -1.0, 1.0))
        .unwrap();
    let attrs = Conv2dAttrs {
        strides: [2, 2],
        pads: [1, 1, 0, 0],
        ..Conv2dAttrs::default()
    };
    let y = if fused {
        let op = Op::Fused(FusedOp {
            anchor: Box::new(Op::Conv2d(attrs)),
            post_ops: vec![
                PostOp::Binary {
                    op: BinaryOp::Sub,
                    acc_is_lhs,
                },
                PostOp::Unary(UnaryOp::Relu),
            ],
        });
        b.op(op, &[x, w, bias, skip]).unwrap()
    } else {
        let c = b.op(Op::Conv2d(attrs), &[x, w, bias]).unwrap();
        let operands = if acc_is_lhs { [c, skip] } else { [skip, c] };
        let s = b.op(Op::Binary(BinaryOp::Sub), &operands).unwrap();
        b.op(Op::Unary(UnaryOp::Relu), &[s]).unwrap()
    };
    b.finish(&[("y", y)]);
    m
}

#[test]
fn fused_conv_sub_relu_equals_unfused_exactly_in_both_operand_orders() {
    let x = random(&[1, 3, 6, 6], 71);
    let skip = random(&[1, 4, 3, 3], 72);
    for acc_is_lhs in [true, false] {
        let fused = conv_add_relu(true, acc_is_lhs);
        let unfused = conv_add_relu(false, acc_is_lhs);
        let inputs = [x.clone(), skip.clone()];
        let a = interp::run(&fused, &fused.funcs[0], &inputs).unwrap();
        let b = interp::run(&unfused, &unfused.funcs[0], &inputs).unwrap();
        assert_eq!(a, b, "acc_is_lhs = {acc_is_lhs}");
        assert!(a[0].f32s().iter().any(|&v| v > 0.0));
        assert!(a[0].f32s().contains(&0.0), "relu clamps something");
    }
}

#[test]
fn fused_post_ops_apply_in_order_with_broadcast_operands() {
    // gemm anchor → mul by per-column [N] → div of scalar by acc → clip
    let a = random(&[3, 4], 81);
    let b = random(&[4, 5], 82);
    let cols = random(&[5], 83);
    let scalar = t(&[], &[2.0]);
    let clip = UnaryOp::Clip {
        min: F32(-3.0),
        max: F32(3.0),
    };
    let gemm = Op::Gemm(GemmAttrs::default());
    let op = Op::Fused(FusedOp {
        anchor: Box::new(gemm.clone()),
        post_ops: vec![
            PostOp::Binary {
                op: BinaryOp::Mul,
                acc_is_lhs: true,
            },
            PostOp::Binary {
                op: BinaryOp::Div,
                acc_is_lhs: false,
            },
            PostOp::Unary(clip),
        ],
    });
    let fused = eval(op, &[&a, &b, &cols, &scalar]);
    let step = eval(gemm, &[&a, &b]);
    let step = eval(Op::Binary(BinaryOp::Mul), &[&step, &cols]);
    let step = eval(Op::Binary(BinaryOp::Div), &[&scalar, &step]);
    let step = eval(Op::Unary(clip), &[&step]);
    assert_eq!(fused.data, step.data);

    // a pool anchor and a layer_norm anchor
    let x = random(&[1, 2, 5, 5], 84);
    let p = Op::AvgPool2d {
        pool: pool(2, 2, 1, true),
        count_include_pad: false,
    };
    let fused = eval(
        Op::Fused(FusedOp {
            anchor: Box::new(p.clone()),
            post_ops: vec![PostOp::Unary(UnaryOp::Sigmoid)],
        }),
        &[&x],
    );
    let step = eval(Op::Unary(UnaryOp::Sigmoid), &[&eval(p, &[&x])]);
    assert_eq!(fused.data, step.data);
    let scale = random(&[5], 85);
    let ln = Op::LayerNorm {
        axis: 3,
        epsilon: F32(1e-5),
    };
    let fused = eval(
        Op::Fused(FusedOp {
            anchor: Box::new(ln.clone()),
            post_ops: vec![PostOp::Unary(UnaryOp::Gelu {
                approximate: GeluApproximation::Tanh,
            })],
        }),
        &[&x, &scale],
    );
    let step = eval(
        Op::Unary(UnaryOp::Gelu {
            approximate: GeluApproximation::Tanh,
        }),
        &[&eval(ln, &[&x, &scale])],
    );
    assert_eq!(fused.data, step.data);
}

// ---------------------------------------------------------------- functions

#[test]
fn run_keep_all_returns_every_value_and_run_returns_results() {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", TensorType::f32([2]));
    let y = b.param("y", TensorType::f32([2]));
    let s = b.op(Op::Binary(BinaryOp::Add), &[x, y]).unwrap();
    let r = b.op(Op::Unary(UnaryOp::Relu), &[s]).unwrap();
    let _dead = b.op(Op::Unary(UnaryOp::Tanh), &[s]).unwrap();
    b.finish(&[("r", r), ("x_again", x), ("r_again", r)]);
    let f = &m.funcs[0];
    let inputs = [t(&[2], &[1.0, -5.0]), t(&[2], &[2.0, 1.0])];
    let all = interp::run_keep_all(&m, f, &inputs).unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(all[0], inputs[0]);
    assert_eq!(all[2].data, vec![3.0, -4.0]);
    assert_eq!(all[3].data, vec![3.0, 0.0]);
    assert_eq!(all[4].data, vec![3f32.tanh(), (-4f32).tanh()]);
    let out = interp::run(&m, f, &inputs).unwrap();
    assert_eq!(out, vec![all[3].clone(), inputs[0].clone(), all[3].clone()]);
}

#[test]
fn bad_inputs_are_errors_naming_the_parameter() {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("image", TensorType::f32([1, 4, 2, 2]));
    let r = b.op(Op::Unary(UnaryOp::Relu), &[x]).unwrap();
    b.finish(&[("r", r)]);
    let f = &m.funcs[0];
    let good = random(&[1, 4, 2, 2], 1);

    let e = interp::run(&m, f, &[]).unwrap_err();
    assert_eq!(e.code, "bad-input");
    assert!(
        e.message.contains("takes 1 inputs") && e.message.contains("%image"),
        "{e}"
    );
    assert!(interp::run(&m, f, &[good.clone(), good.clone()]).is_err());

    let e = interp::run(&m, f, &[random(&[1, 4, 2, 3], 1)]).unwrap_err();
    assert!(
        e.message.contains("%image") && e.message.contains("1x4x2x3"),
        "{e}"
    );

    let mut short = good.clone();
    short.data = short.f32s()[1..].to_vec().into();
    let e = interp::run(&m, f, &[short]).unwrap_err();
    assert!(
        e.message.contains("%image") && e.message.contains("15"),
        "{e}"
    );

    let e = interp::run(&m, f, &[good.to_layout(NCHW4C)]).unwrap_err();
    assert!(
        e.message.contains("%image") && e.message.contains("nchw4c"),
        "{e}"
    );

    assert!(interp::run(&m, f, &[good]).is_ok());
}

#[test]
fn bad_operands_and_result_types_are_errors() {
    let store = WeightStore::new();
    let x = random(&[2, 3], 1);
    let relu = Op::Unary(UnaryOp::Relu);
    // declared result dims disagree with the type rule
    let e = eval_op(&relu, &[&x], &TensorType::f32([3, 2]), &store).unwrap_err();
    assert_eq!(e.code, "type-mismatch");
    // operand count
    assert!(eval_op(&relu, &[&x, &x], &x.ty, &store).is_err());
    // operand data shorter than its type
    let broken = Tensor {
        ty: x.ty.clone(),
        data: vec![1.0; 5].into(),
    };
    let e = eval_op(&relu, &[&broken], &x.ty, &store).unwrap_err();
    assert_eq!(e.code, "bad-operand");
    // a layout that does not fit the rank, and a zero block
    for layout in [
        Layout::Blocked { axis: 7, block: 4 },
        Layout::Blocked { axis: 0, block: 0 },
    ] {
        let odd = Tensor {
            ty: x.ty.with_layout(layout),
            data: x.data.clone(),
        };
        assert!(eval_op(&relu, &[&odd], &x.ty, &store).is_err());
        assert!(eval_op(&relu, &[&x], &x.ty.with_layout(layout), &store).is_err());
    }
    // shapes the op rejects
    let w = random(&[2, 2, 3, 3], 2);
    let img = random(&[1, 3, 5, 5], 3);
    let conv = Op::Conv2d(Conv2dAttrs::default());
    assert!(eval_op(&conv, &[&img, &w], &TensorType::f32([1, 2, 3, 3]), &store).is_err());
    let a = random(&[2, 3], 4);
    assert!(eval_op(&Op::MatMul, &[&a, &a], &TensorType::f32([2, 3]), &store).is_err());
}

#[test]
fn malformed_function_is_an_error_not_a_panic() {
    let m = Module::default();
    let ty = TensorType::f32([2]);
    let f = Func {
        name: "f".into(),
        params: vec![Param {
            name: "x".into(),
            ty: ty.clone(),
        }],
        insts: vec![Inst {
            op: Op::Unary(UnaryOp::Relu),
            operands: vec![Value(5)],
            ty: ty.clone(),
            loc: Location::file("bad.tir", 3, 7),
        }],
        results: vec![],
        loc: Location::Unknown,
    };
    let e = interp::run(&m, &f, &[t(&[2], &[1.0, 2.0])]).unwrap_err();
    assert_eq!(e.code, "undefined-value");
    assert_eq!(e.location, Location::file("bad.tir", 3, 7));
    let mut g = f.clone();
    g.insts.clear();
    g.results = vec![smelt_ir::FuncResult {
        name: "y".into(),
        value: Value(3),
    }];
    assert!(interp::run(&m, &g, &[t(&[2], &[1.0, 2.0])]).is_err());
}

#[test]
fn every_op_gives_the_same_values_from_blocked_operands() {
    // Each operand is re-laid out blocked along its last axis (block 3, so padding is
    // exercised) and the result is asked for blocked along axis 0.
    let x4 = random(&[2, 5, 5, 4], 91);
    let v5 = |seed| random(&[5], seed);
    let var = t(&[5], &random_f32(92, 5, 0.5, 1.5));
    let m23 = random(&[2, 3], 93);
    let m34 = random(&[3, 4], 94);
    let w = random(&[4, 5, 3, 3], 95);
    let cases: Vec<(Op, Vec<Tensor>)> = vec![
        (
            Op::Conv2d(Conv2dAttrs {
                pads: [1, 0, 0, 1],
                ..Conv2dAttrs::default()
            }),
            vec![x4.clone(), w.clone(), random(&[4], 96)],
        ),
        (
            Op::BatchNorm { epsilon: F32(1e-5) },
            vec![x4.clone(), v5(97), v5(98), v5(99), var.clone()],
        ),
        (Op::Unary(UnaryOp::Tanh), vec![x4.clone()]),
        (
            Op::Binary(BinaryOp::Div),
            vec![x4.clone(), random(&[5, 1, 1], 100)],
        ),
        (
            Op::LayerNorm {
                axis: 2,
                epsilon: F32(1e-5),
            },
            vec![x4.clone(), random(&[5, 4], 101), random(&[5, 4], 102)],
        ),
        (Op::MaxPool2d(pool(2, 2, 1, true)), vec![x4.clone()]),
        (
            Op::AvgPool2d {
                pool: pool(3, 2, 1, true),
                count_include_pad: true,
            },
            vec![x4.clone()],
        ),
        (Op::GlobalAvgPool, vec![x4.clone()]),
        (Op::Flatten { axis: 2 }, vec![x4.clone()]),
        (
            Op::Reshape {
                shape: vec![10, 20],
            },
            vec![x4.clone()],
        ),
        (
            Op::Transpose {
                perm: vec![3, 1, 0, 2],
            },
            vec![x4.clone()],
        ),
        (Op::MatMul, vec![m23.clone(), m34.clone()]),
        (
            Op::Gemm(GemmAttrs {
                trans_a: true,
                ..GemmAttrs::default()
            }),
            vec![random(&[3, 2], 103), m34.clone(), random(&[4], 104)],
        ),
        (
            Op::Concat { axis: 1 },
            vec![m23.clone(), random(&[2, 4], 116)],
        ),
        (Op::Softmax { axis: 1 }, vec![x4.clone()]),
        (
            Op::Reorder {
                layout: Layout::RowMajor,
            },
            vec![x4.clone()],
        ),
        (
            Op::BnFoldWeight { epsilon: F32(1e-5) },
            vec![random(&[5, 2, 3, 3], 105), v5(106), var.clone()],
        ),
        (
            Op::BnFoldBias { epsilon: F32(1e-5) },
            vec![v5(107), v5(108), v5(109), var.clone(), v5(110)],
        ),
    ];
    for (op, operands) in cases {
        let refs: Vec<&Tensor> = operands.iter().collect();
        let plain = eval(op.clone(), &refs);
        let blocked: Vec<Tensor> = operands
            .iter()
            .map(|t| {
                let axis = (t.ty.rank() - 1) as u8;
                t.to_layout(Layout::Blocked { axis, block: 3 })
            })
            .collect();
        let refs: Vec<&Tensor> = blocked.iter().collect();
        let ty = result_type(&op, &refs).with_layout(Layout::Blocked { axis: 0, block: 3 });
        let got = eval_op(&op, &refs, &ty, &WeightStore::new()).unwrap();
        assert_eq!(got.ty, ty, "{}", op.name());
        assert_eq!(got.f32s_row_major(), plain.data, "{}", op.name());
    }
}

#[test]
fn i64_constants_read_as_exact_values() {
    let mut store = WeightStore::new();
    let ty = TensorType {
        dtype: smelt_ir::DType::I64,
        dims: vec![3],
        layout: Layout::RowMajor,
    };
    let id = store
        .add(
            "shape",
            ty.clone(),
            AlignedBuf::from_i64(&[1, -64, 3136]),
            WeightOrigin::Inline,
        )
        .unwrap();
    let y = eval_op(&Op::Const(id), &[], &ty, &store).unwrap();
    assert_eq!(y.ty, ty);
    assert_eq!(y.data, smelt_ir::TensorData::I64(vec![1, -64, 3136]));
}

#[test]
fn fused_matmul_and_pool_anchors_equal_unfused() {
    let a = random(&[2, 3, 4], 111);
    let b = random(&[4, 5], 112);
    let bias = random(&[5], 113);
    let mm = eval(
        Op::Fused(FusedOp {
            anchor: Box::new(Op::MatMul),
            post_ops: vec![
                PostOp::Binary {
                    op: BinaryOp::Add,
                    acc_is_lhs: false,
                },
                PostOp::Unary(UnaryOp::Silu),
            ],
        }),
        &[&a, &b, &bias],
    );
    let step = eval(Op::MatMul, &[&a, &b]);
    let step = eval(Op::Binary(BinaryOp::Add), &[&bias, &step]);
    let step = eval(Op::Unary(UnaryOp::Silu), &[&step]);
    assert_eq!(mm.data, step.data);

    let x = random(&[1, 3, 6, 6], 114);
    let residual = random(&[1, 3, 3, 3], 115);
    let mp = Op::MaxPool2d(pool(2, 2, 0, false));
    let fused = eval(
        Op::Fused(FusedOp {
            anchor: Box::new(mp.clone()),
            post_ops: vec![
                PostOp::Binary {
                    op: BinaryOp::Max,
                    acc_is_lhs: true,
                },
                PostOp::Unary(UnaryOp::LeakyRelu { alpha: F32(0.5) }),
            ],
        }),
        &[&x, &residual],
    );
    let step = eval(Op::Binary(BinaryOp::Max), &[&eval(mp, &[&x]), &residual]);
    let step = eval(Op::Unary(UnaryOp::LeakyRelu { alpha: F32(0.5) }), &[&step]);
    assert_eq!(fused.data, step.data);

    let gap = eval(
        Op::Fused(FusedOp {
            anchor: Box::new(Op::GlobalAvgPool),
            post_ops: vec![PostOp::Unary(UnaryOp::HardSwish)],
        }),
        &[&x],
    );
    let step = eval(
        Op::Unary(UnaryOp::HardSwish),
        &[&eval(Op::GlobalAvgPool, &[&x])],
    );
    assert_eq!(gap.data, step.data);
}

fn slice_op(starts: &[i64], ends: &[i64], steps: &[i64]) -> Op {
    Op::Slice(SliceAttrs {
        starts: starts.to_vec(),
        ends: ends.to_vec(),
        steps: steps.to_vec(),
    })
}

#[test]
fn slice_hand_examples_with_negative_steps_and_bad_windows() {
    let x = iota(&[3, 4], 0.0); // [[0,1,2,3],[4,5,6,7],[8,9,10,11]]
    let y = eval(slice_op(&[1, 1], &[3, 4], &[1, 2]), &[&x]);
    assert_eq!(y.dims(), [2, 2]);
    assert_exact(&y, &[5.0, 7.0, 9.0, 11.0]);
    // reversed rows and columns, down to index 0
    let y = eval(slice_op(&[2, 3], &[-1, -1], &[-1, -1]), &[&x]);
    assert_eq!(y.dims(), [3, 4]);
    assert_exact(
        &y,
        &[11.0, 10.0, 9.0, 8.0, 7.0, 6.0, 5.0, 4.0, 3.0, 2.0, 1.0, 0.0],
    );
    let y = eval(slice_op(&[0, 3], &[3, 0], &[2, -2]), &[&x]);
    assert_eq!(y.dims(), [2, 2]);
    assert_exact(&y, &[3.0, 1.0, 11.0, 9.0]);
    // a step of 0 and an end past the dim are type errors
    for bad in [
        slice_op(&[0, 0], &[3, 4], &[0, 1]),
        slice_op(&[0, 0], &[3, 5], &[1, 1]),
    ] {
        assert!(bad.infer_type(&[&x.ty], &|_| None).is_err());
    }
    // an empty window is an empty result, as in ONNX
    let y = eval(slice_op(&[1, 0], &[1, 4], &[1, 1]), &[&x]);
    assert_eq!(y.dims(), [0, 4]);
    assert_exact(&y, &[]);
}

#[test]
fn expand_and_tile_hand_examples() {
    let col = iota(&[2, 1], 1.0); // [[1],[2]]
    let y = eval(
        Op::Expand {
            shape: vec![2, 2, 3],
        },
        &[&col],
    );
    assert_exact(
        &y,
        &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0],
    );
    let m = iota(&[2, 2], 0.0); // [[0,1],[2,3]]
    let y = eval(
        Op::Tile {
            repeats: vec![2, 3],
        },
        &[&m],
    );
    assert_eq!(y.dims(), [4, 6]);
    assert_exact(
        &y,
        &[
            0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0, 2.0, 3.0, 0.0, 1.0, 0.0, 1.0, 0.0,
            1.0, 2.0, 3.0, 2.0, 3.0, 2.0, 3.0,
        ],
    );
    // an expand that does not broadcast, a shrinking expand, repeats of the wrong length
    for bad in [
        Op::Expand { shape: vec![2, 3] },
        Op::Expand { shape: vec![1, 1] },
        Op::Tile { repeats: vec![2] },
    ] {
        assert!(bad.infer_type(&[&m.ty], &|_| None).is_err(), "{bad:?}");
    }
    // 0 repeats empty that axis
    let y = eval(
        Op::Tile {
            repeats: vec![0, 1],
        },
        &[&m],
    );
    assert_eq!(y.dims(), [0, 2]);
}

// ---------------------------------------------------------------- grid_sample

/// `grid_sample` on the 2×3 image 1..6 at hand-placed points: inside, on the corners, past
/// the border (zeros, clamped, reflected) and at NaN.
#[test]
fn grid_sample_hand_examples() {
    use smelt_ir::op::{GridPadding, GridSampleAttrs, SampleMode};
    let x = iota(&[1, 1, 2, 3], 1.0);
    let sample = |mode, padding, align_corners, points: &[(f32, f32)]| {
        let g: Vec<f32> = points.iter().flat_map(|&(gx, gy)| [gx, gy]).collect();
        let grid = t(&[1, 1, points.len(), 2], &g);
        let op = Op::GridSample(GridSampleAttrs {
            mode,
            padding,
            align_corners,
        });
        eval(op, &[&x, &grid])
    };
    use GridPadding::{Border, Reflection, Zeros};
    use SampleMode::{Cubic, Linear, Nearest};
    // the centre (column 1, between the rows) and the top-left corner's outer edge, a
    // quarter of element 1 and three quarters of zeros
    assert_close(
        &sample(Linear, Zeros, false, &[(0.0, 0.0), (-1.0, -1.0)]),
        &[3.5, 0.25],
        1e-7,
    );
    // border: the outer edge reads the edge element; far outside clamps to it
    assert_close(
        &sample(Linear, Border, false, &[(-1.0, -1.0), (5.0, 5.0)]),
        &[1.0, 6.0],
        1e-7,
    );
    // reflection: x = 3.25 reflects at 2.5 to 1.75, y = 0.5
    assert_close(
        &sample(Linear, Reflection, false, &[(1.5, 0.0)]),
        &[0.5 * (2.0 * 0.25 + 3.0 * 0.75) + 0.5 * (5.0 * 0.25 + 6.0 * 0.75)],
        1e-7,
    );
    // aligned corners: 1 is the last element's centre
    assert_close(
        &sample(Linear, Zeros, true, &[(1.0, 1.0), (-1.0, 1.0)]),
        &[6.0, 4.0],
        1e-7,
    );
    // nearest rounds halves to even (y = 0.5 → row 0); a NaN coordinate is padding
    assert_close(
        &sample(Nearest, Border, false, &[(0.0, 0.0), (f32::NAN, 0.0)]),
        &[2.0, 1.0],
        1e-7,
    );
    assert_close(
        &sample(
            Nearest,
            Zeros,
            false,
            &[(f32::NAN, 0.0), (0.0, f32::INFINITY)],
        ),
        &[0.0, 0.0],
        1e-7,
    );
    // cubic at an element's centre reproduces it (weights 0, 1, 0, 0)
    assert_close(
        &sample(Cubic, Border, true, &[(0.0, -1.0), (1.0, 1.0)]),
        &[2.0, 6.0],
        1e-6,
    );
    // cubic border clamps the taps, not the coordinate, as PyTorch and onnxruntime: at
    // x = -0.5 the taps -2, -1, 0, 1 read elements 1, 1, 1, 2 with weights -3/32, 19/32,
    // 19/32, -3/32 (the reference's clamp of the coordinate to 0 would give 1)
    assert_close(
        &sample(Cubic, Border, true, &[(-1.5, -1.0)]),
        &[1.0 + 3.0 / 32.0 - 2.0 * 3.0 / 32.0],
        1e-6,
    );
}
