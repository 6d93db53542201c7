//! The JIT end to end: fused conv tails and residual blocks against the interpreter,
//! thread safety, input checking, and snapshots of the thin-path kernel's loop IR and CLIF.

mod common;
mod jit_util;

use jit_util::{add_relu, check_against_interp, f32t, opts, random, random_inputs};
use smelt::codegen::{clif_text, TargetDesc};
use smelt::runtime::{Elements, Executable};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{Conv2dAttrs, FusedOp, GeluApproximation, PostOp};
use smelt_ir::weights::random_f32;
use smelt_ir::{BinaryOp, Module, Op, Tensor, UnaryOp, F32};
use smelt_passes::lower;

/// Geometry of one conv test case.
#[derive(Clone, Debug)]
struct ConvCase {
    n: usize,
    c: usize,
    o: usize,
    hw: [usize; 2],
    k: [usize; 2],
    attrs: Conv2dAttrs,
    bias: bool,
}

impl ConvCase {
    fn new(c: usize, o: usize, hw: [usize; 2], k: usize) -> ConvCase {
        ConvCase {
            n: 1,
            c,
            o,
            hw,
            k: [k, k],
            attrs: Conv2dAttrs {
                pads: [k / 2; 4],
                ..Conv2dAttrs::default()
            },
            bias: true,
        }
    }
}

/// `func @tail(x, skip) = post_ops(conv2d(x, w, b), skip…)` with every binary post-op
/// taking the residual-shaped operand `skip` (or per-channel vectors, see `extra`).
fn fused_conv_module(case: &ConvCase, post_ops: &[PostOp], extra: &[Vec<usize>]) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "tail");
    let x = b.param("x", f32t(&[case.n, case.c, case.hw[0], case.hw[1]]));
    let extra_params: Vec<_> = extra
        .iter()
        .enumerate()
        .map(|(i, d)| b.param(&format!("p{i}"), f32t(d)))
        .collect();
    let cg = case.c / case.attrs.groups;
    let wdims = [case.o, cg, case.k[0], case.k[1]];
    let w = b
        .constant(
            "w",
            f32t(&wdims),
            &random_f32(11, wdims.iter().product(), -0.5, 0.5),
        )
        .expect("weight");
    let mut operands = vec![x, w];
    if case.bias {
        let bias = b
            .constant("b", f32t(&[case.o]), &random_f32(12, case.o, -0.5, 0.5))
            .expect("bias");
        operands.push(bias);
    }
    operands.extend(extra_params);
    let fused = Op::Fused(FusedOp {
        anchor: Box::new(Op::Conv2d(case.attrs.clone())),
        post_ops: post_ops.to_vec(),
    });
    let y = b.op(fused, &operands).expect("fused conv type-checks");
    b.finish(&[("y", y)]);
    m
}

fn out_dims(case: &ConvCase) -> Vec<usize> {
    let a = &case.attrs;
    let size = |i: usize| {
        let span = a.dilations[i] * (case.k[i] - 1) + 1;
        (case.hw[i] + a.pads[i] + a.pads[i + 2] - span) / a.strides[i] + 1
    };
    vec![case.n, case.o, size(0), size(1)]
}

fn check_fused_tail(what: &str, case: &ConvCase) {
    let m = fused_conv_module(case, &add_relu(), &[out_dims(case)]);
    let inputs = random_inputs(&m, 3);
    check_against_interp(what, &m, &inputs, 1e-5);
}

#[test]
fn thin_path_fused_conv_add_relu_matches_interpreter() {
    check_fused_tail("3x3 pad 1", &ConvCase::new(8, 8, [9, 9], 3));
}

#[test]
fn fused_tail_over_conv_geometries() {
    let mut cases = Vec::new();
    // odd channel counts and widths that are not multiples of 4 or 12 (vector tails)
    cases.push(("odd channels", ConvCase::new(5, 7, [7, 13], 3)));
    let mut c = ConvCase::new(6, 6, [10, 11], 3);
    c.attrs.strides = [2, 2];
    cases.push(("stride 2", c));
    let mut c = ConvCase::new(4, 5, [9, 10], 3);
    c.attrs.pads = [0, 1, 2, 0];
    c.attrs.strides = [1, 2];
    cases.push(("asymmetric pads, stride 1x2", c));
    let mut c = ConvCase::new(3, 4, [11, 12], 3);
    c.attrs.dilations = [2, 2];
    c.attrs.pads = [2; 4];
    cases.push(("dilation 2", c));
    let mut c = ConvCase::new(6, 9, [8, 8], 3);
    c.attrs.groups = 3;
    cases.push(("groups 3", c));
    let mut c = ConvCase::new(8, 8, [7, 9], 3);
    c.attrs.groups = 8;
    cases.push(("depthwise", c));
    // depthwise 3x3, pad 1, whole vectors of columns: the kernel reading NCHW directly
    // (3 vectors per row; one vector, which is also the last, over 2 rows; batch 2)
    let mut c = ConvCase::new(8, 8, [7, 12], 3);
    c.attrs.groups = 8;
    cases.push(("depthwise 3x3 from NCHW", c));
    let mut c = ConvCase::new(5, 5, [2, 4], 3);
    c.attrs.groups = 5;
    c.bias = false;
    c.n = 2;
    cases.push(("depthwise 3x3 from NCHW, 2x4 plane, batch 2", c));
    let mut c = ConvCase::new(5, 6, [6, 7], 1);
    c.bias = false;
    c.n = 2;
    cases.push(("1x1 no bias batch 2", c));
    let mut c = ConvCase::new(3, 4, [1, 1], 1);
    c.attrs.pads = [0; 4];
    cases.push(("1x1 spatial", c));
    let mut c = ConvCase::new(3, 16, [17, 30], 5);
    c.attrs.strides = [3, 3];
    c.attrs.pads = [1, 2, 0, 3];
    cases.push(("5x5 stride 3 wide", c));
    // three channels (an RGB stem): the channels-last copy interleaves whole vectors
    let mut c = ConvCase::new(3, 8, [9, 14], 7);
    c.attrs.strides = [2, 2];
    c.n = 2;
    cases.push(("rgb 7x7 stride 2, batch 2", c));
    // output channels per group a multiple of 4: the packed kernel on channels-last input
    let mut c = ConvCase::new(6, 8, [9, 10], 3);
    c.n = 2;
    cases.push(("packed, batch 2", c));
    let mut c = ConvCase::new(8, 16, [7, 9], 3);
    c.attrs.groups = 2;
    cases.push(("packed, groups 2", c));
    let mut c = ConvCase::new(5, 8, [10, 11], 3);
    c.attrs.strides = [2, 2];
    cases.push(("packed, stride 2, 5 input channels", c));
    let mut c = ConvCase::new(8, 8, [11, 13], 3);
    c.attrs.dilations = [2, 2];
    c.attrs.pads = [2, 1, 2, 3];
    cases.push(("packed, dilation 2, asymmetric pads", c));
    let mut c = ConvCase::new(12, 8, [6, 7], 1);
    c.attrs.pads = [0; 4];
    c.n = 3;
    cases.push(("packed 1x1, batch 3", c));
    // 22 input channels: the channels-last copy's 16-channel, 4-channel and scalar paths
    cases.push(("packed, 22 input channels", ConvCase::new(22, 8, [5, 9], 3)));
    // many input channels: the K loop runs in parts with partial sums in between
    cases.push((
        "packed, 128 channels in 2 parts",
        ConvCase::new(128, 8, [6, 13], 3),
    ));
    let mut c = ConvCase::new(1024, 12, [3, 14], 1);
    c.attrs.pads = [0; 4];
    c.n = 2;
    cases.push(("packed 1x1, 1024 channels in 4 parts, batch 2", c));
    let mut c = ConvCase::new(256, 8, [9, 9], 3);
    c.attrs.strides = [2, 2];
    cases.push(("packed, stride 2, 256 channels in parts", c));
    // 16 output channels per group: tiles call the micro-kernels (where the host runs
    // them); unpadded 1×1 convs read NCHW, strided ones a subsampled copy, and their
    // planes are walked as rows of whole calls
    let mut c = ConvCase::new(24, 32, [9, 11], 1);
    c.attrs.pads = [0; 4];
    c.attrs.strides = [2, 2];
    c.n = 2;
    cases.push(("micro 1x1 stride 2, batch 2", c));
    let mut c = ConvCase::new(20, 16, [10, 7], 1);
    c.attrs.pads = [0; 4];
    c.attrs.strides = [3, 1];
    cases.push(("micro 1x1 stride 3x1", c));
    let mut c = ConvCase::new(40, 16, [7, 7], 1);
    c.attrs.pads = [0; 4];
    cases.push(("micro 1x1, 7x7 plane as one row", c));
    let mut c = ConvCase::new(36, 48, [5, 9], 3);
    c.attrs.groups = 3;
    cases.push(("micro 3x3, groups 3", c));
    let mut c = ConvCase::new(16, 16, [9, 9], 3);
    c.attrs.strides = [2, 2];
    c.attrs.dilations = [2, 1];
    cases.push(("micro 3x3, stride 2, row dilation 2", c));
    // output channels per group that no routine's lanes divide: the micro-kernel's last
    // block is zero-padded and only the channels the result has are stored — whole
    // vectors of 4, then a partial one (bias read per channel)
    cases.push((
        "micro ragged, 24 channels",
        ConvCase::new(16, 24, [6, 9], 3),
    ));
    let mut c = ConvCase::new(12, 40, [5, 8], 1);
    c.attrs.pads = [0; 4];
    c.n = 2;
    cases.push(("micro ragged 1x1, 40 channels, batch 2", c));
    let mut c = ConvCase::new(20, 51, [4, 7], 1);
    c.attrs.pads = [0; 4];
    cases.push(("micro ragged 1x1, 51 channels: a partial vector", c));
    let mut c = ConvCase::new(8, 22, [5, 6], 3);
    c.bias = false;
    cases.push(("micro ragged, 22 channels, no bias", c));
    let mut c = ConvCase::new(12, 48, [6, 5], 3);
    c.attrs.groups = 2;
    cases.push(("micro ragged, groups 2 of 24 channels", c));
    // depthwise 5×5 and 7×7 with rows of at least one routine vector: the native
    // depthwise-row routine on micro-kernel targets (strided ones read a phase split)
    let mut c = ConvCase::new(6, 6, [9, 37], 5);
    c.attrs.groups = 6;
    c.n = 2;
    cases.push(("depthwise 5x5 rows, batch 2", c));
    let mut c = ConvCase::new(5, 5, [11, 35], 5);
    c.attrs.groups = 5;
    c.attrs.strides = [2, 2];
    cases.push(("depthwise 5x5 rows, stride 2", c));
    let mut c = ConvCase::new(4, 4, [10, 40], 7);
    c.attrs.groups = 4;
    c.attrs.strides = [1, 2];
    c.attrs.dilations = [1, 2];
    c.attrs.pads = [3, 6, 3, 6];
    c.bias = false;
    cases.push(("depthwise 7x7 rows, stride 1x2, column dilation 2", c));
    let mut c = ConvCase::new(3, 3, [6, 6], 5);
    c.attrs.groups = 3;
    cases.push(("depthwise 5x5, rows too short for the routine", c));
    // narrow planes take tiles of several rows (one chain per row): 17 rows in tiles of
    // 12, the last overlapping the first; a stride-2 plane of 8 rows in one tile
    let mut c = ConvCase::new(4, 4, [17, 7], 5);
    c.attrs.groups = 4;
    c.n = 2;
    cases.push(("depthwise 5x5, 17 narrow rows in tiles of 12", c));
    let mut c = ConvCase::new(3, 3, [15, 9], 3);
    c.attrs.groups = 3;
    c.attrs.strides = [2, 2];
    cases.push(("depthwise 3x3 stride 2, 8 narrow rows in one tile", c));
    for (what, case) in &cases {
        check_fused_tail(what, case);
    }
}

/// Depthwise 5×5 convs on a micro-kernel target lower to the native depthwise-row
/// routine (after the padded copy); 3×3 ones, rows shorter than a routine vector, and
/// Cranelift-only lowering keep the Cranelift kernels.
#[test]
fn depthwise_5x5_rows_call_the_native_routine() {
    let names = |case: &ConvCase, micro: Option<smelt_ir::loops::TileTarget>| {
        let m = fused_conv_module(case, &add_relu(), &[out_dims(case)]);
        let opts = lower::LowerOptions {
            micro,
            ..Default::default()
        };
        let p = lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
        p.kernels.iter().map(|k| k.name.clone()).collect::<Vec<_>>()
    };
    let rows = |names: &[String]| names.iter().any(|k| k.starts_with("conv2d_depthwise_rows"));
    let mut c = ConvCase::new(8, 8, [12, 20], 5);
    c.attrs.groups = 8;
    for isa in [
        smelt::microkernels::TileIsa::Avx2,
        smelt::microkernels::TileIsa::Avx512,
    ] {
        let got = names(&c, Some(isa.target()));
        assert!(rows(&got), "{isa:?}: {got:?}");
    }
    assert!(!rows(&names(&c, None)));
    let mut short = c.clone();
    short.hw = [12, 6];
    let avx512 = Some(smelt::microkernels::TileIsa::Avx512.target());
    assert!(!rows(&names(&short, avx512)));
    let mut three = ConvCase::new(8, 8, [12, 20], 3);
    three.attrs.groups = 8;
    assert!(!rows(&names(&three, avx512)));
}

/// Depthwise 3×3 convs with one pixel of padding and whole vectors of columns lower to
/// the kernel that reads NCHW directly (no padded copy); others keep the general one.
#[test]
fn depthwise_3x3_reads_nchw_without_a_padded_copy() {
    let names = |case: &ConvCase| {
        let m = fused_conv_module(case, &add_relu(), &[out_dims(case)]);
        let p =
            lower::lower_with(&m, &m.funcs[0], &lower::LowerOptions::default()).expect("lowers");
        p.kernels.iter().map(|k| k.name.clone()).collect::<Vec<_>>()
    };
    let mut c = ConvCase::new(8, 8, [7, 12], 3);
    c.attrs.groups = 8;
    assert_eq!(names(&c), ["conv2d_depthwise3x3_1x8x7x12_bias_fused"]);
    // 9 columns (not whole vectors): the padded copy and the general kernel
    c.hw = [7, 9];
    let general = names(&c);
    assert!(general.iter().any(|k| k.starts_with("pad_")), "{general:?}");
}

/// An epilogue operand that broadcasts over rows but not columns keeps a 1×1 conv's
/// plane in its real rows (it cannot be walked as longer rows).
#[test]
fn micro_1x1_with_a_row_broadcast_operand_keeps_its_rows() {
    let mut case = ConvCase::new(8, 16, [7, 7], 1);
    case.attrs.pads = [0; 4];
    let m = fused_conv_module(&case, &add_relu(), &[vec![1, 16, 1, 7]]);
    check_against_interp("row-broadcast add", &m, &random_inputs(&m, 4), 1e-5);
}

/// Every post-op kind, with per-channel, scalar and full-tensor operands on either side.
#[test]
fn every_post_op_kind_is_applied_in_registers() {
    // 5 output channels: the generic kernel (lane by lane); 8 channels with constant
    // weights: the packed kernel, whose 4×4 tiles are transposed so the post-ops run on
    // vectors along W (9 columns: two transposed quads and a one-column tail), batch 2
    let mut packed = ConvCase::new(4, 8, [6, 9], 3);
    packed.n = 2;
    for case in [ConvCase::new(4, 5, [6, 9], 3), packed] {
        check_every_post_op_kind(&case);
    }
}

/// A leading SiLU or sigmoid post-op on a micro-kernel tile runs natively with the
/// bias, over full blocks (a partial block's tile in Cranelift code): every kernel
/// choice against the interpreter, with the post-ops after it (a residual add), no bias,
/// a partial block (24 channels: 16 + 8 on 16 lanes, one partial block on 32) and large
/// magnitudes (the exponential's clamps); the lowering for a micro-kernel target calls
/// the routine.
#[test]
fn a_leading_activation_runs_natively_on_micro_kernel_tiles() {
    let silu = PostOp::Unary(UnaryOp::Silu);
    let sigmoid = PostOp::Unary(UnaryOp::Sigmoid);
    let add = PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: true,
    };
    let mut no_bias = ConvCase::new(8, 32, [6, 9], 3);
    no_bias.bias = false;
    let cases = [
        ("silu", ConvCase::new(8, 32, [6, 9], 3), vec![silu]),
        (
            "silu add",
            ConvCase::new(12, 32, [5, 7], 1),
            vec![silu, add],
        ),
        ("silu, no bias", no_bias, vec![silu]),
        (
            "silu, 24 channels",
            ConvCase::new(8, 24, [6, 9], 3),
            vec![silu],
        ),
        ("sigmoid", ConvCase::new(8, 32, [6, 9], 1), vec![sigmoid]),
        (
            "sigmoid add",
            ConvCase::new(12, 32, [5, 7], 3),
            vec![sigmoid, add],
        ),
    ];
    for (what, case, post) in cases {
        let extra: Vec<Vec<usize>> = if post.len() > 1 {
            vec![out_dims(&case)]
        } else {
            Vec::new()
        };
        let m = fused_conv_module(&case, &post, &extra);
        for scale in [1.0f32, 40.0] {
            let mut inputs = random_inputs(&m, 31);
            for v in inputs[0].f32s_mut() {
                *v *= scale;
            }
            check_against_interp(&format!("{what} ×{scale}"), &m, &inputs, 1e-5);
        }
        let opts = lower::LowerOptions {
            micro: Some(smelt::microkernels::TileIsa::Avx2.target()),
            ..Default::default()
        };
        let p = lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
        let routine = if what.starts_with("sigmoid") {
            "call sigmoid_rows"
        } else {
            "call silu_rows"
        };
        assert!(p.dump_loops().contains(routine), "{what}");
    }
}

/// A NaN in the residual reaches the output through add, relu, max, min and clip in the
/// packed kernel's transposed (vector) epilogue and in its scalar tail, as in the
/// interpreter.
#[test]
fn nan_propagates_through_the_packed_conv_epilogue() {
    let case = ConvCase::new(4, 8, [5, 9], 3);
    let full = out_dims(&case);
    let bin = |op| PostOp::Binary {
        op,
        acc_is_lhs: true,
    };
    let clip = UnaryOp::Clip {
        min: F32(-0.25),
        max: F32(0.5),
    };
    let posts: [(&str, Vec<PostOp>); 4] = [
        ("add relu", add_relu()),
        ("max", vec![bin(BinaryOp::Max)]),
        ("min", vec![bin(BinaryOp::Min)]),
        ("add clip", vec![bin(BinaryOp::Add), PostOp::Unary(clip)]),
    ];
    for (what, post) in posts {
        let m = fused_conv_module(&case, &post, std::slice::from_ref(&full));
        let mut inputs = random_inputs(&m, 21);
        // columns 0, 5 (inside the transposed quads) and 8 (the tail) of several rows
        // and channels
        for i in [0, 5, 8, 9 + 5, 45 + 8, 3 * 45 + 9, 7 * 45 + 36 + 8] {
            inputs[1].f32s_mut()[i] = f32::NAN;
        }
        let want = smelt_ir::interp::run(&m, &m.funcs[0], &inputs).expect("interprets");
        let exe = Executable::compile(&m, None, &opts()).expect("compiles");
        let got = exe.run(&inputs).expect("runs");
        let (g, w) = (got[0].f32s(), want[0].f32s());
        assert!(
            w.iter().any(|v| v.is_nan()),
            "{what}: the case has NaN outputs"
        );
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            assert_eq!(
                a.is_nan(),
                b.is_nan(),
                "{what}: output {i}: jit {a}, interpreter {b}"
            );
        }
    }
}

fn check_every_post_op_kind(case: &ConvCase) {
    let case = case.clone();
    let full = out_dims(&case);
    let chan = vec![case.o, 1, 1];
    let scalar = vec![1];
    let f = F32;
    let unaries = [
        UnaryOp::Relu,
        UnaryOp::Clip {
            min: f(-0.25),
            max: f(0.5),
        },
        UnaryOp::LeakyRelu { alpha: f(0.1) },
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Gelu {
            approximate: GeluApproximation::None,
        },
        UnaryOp::Gelu {
            approximate: GeluApproximation::Tanh,
        },
        UnaryOp::Mish,
        UnaryOp::HardSigmoid {
            alpha: f(0.2),
            beta: f(0.5),
        },
        UnaryOp::HardSwish,
        UnaryOp::Silu,
    ];
    for u in unaries {
        let m = fused_conv_module(&case, &[PostOp::Unary(u)], &[]);
        check_against_interp(u.name(), &m, &random_inputs(&m, 5), 1e-5);
    }
    let binaries = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::PRelu,
    ];
    for op in binaries {
        for acc_is_lhs in [true, false] {
            for operand in [&full, &chan, &scalar] {
                let post = [PostOp::Binary { op, acc_is_lhs }];
                let m = fused_conv_module(&case, &post, std::slice::from_ref(operand));
                let mut inputs = random_inputs(&m, 9);
                if op == BinaryOp::Div {
                    // keep divisors away from zero
                    for v in inputs[1].f32s_mut() {
                        *v += 1.5;
                    }
                    if !acc_is_lhs {
                        continue; // dividing by a conv result near zero is ill-conditioned
                    }
                }
                let what = format!("{} acc_is_lhs={acc_is_lhs} operand {operand:?}", op.name());
                check_against_interp(&what, &m, &inputs, 1e-5);
            }
        }
    }
}

/// Conv → BN → Add → ReLU, unfused: plain conv2d, batch_norm, broadcasting add, relu.
fn residual_block(c: usize, hw: usize) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "block");
    let x = b.param("x", f32t(&[1, c, hw, hw]));
    let skip = b.param("skip", f32t(&[1, c, hw, hw]));
    let w = b
        .constant(
            "w",
            f32t(&[c, c, 3, 3]),
            &random_f32(1, c * c * 9, -0.3, 0.3),
        )
        .expect("w");
    let conv = b
        .op(
            Op::Conv2d(Conv2dAttrs {
                pads: [1; 4],
                ..Conv2dAttrs::default()
            }),
            &[x, w],
        )
        .expect("conv");
    let vec_c = |b: &mut FuncBuilder, name: &str, seed, lo, hi| {
        b.constant(name, f32t(&[c]), &random_f32(seed, c, lo, hi))
            .expect("bn param")
    };
    let scale = vec_c(&mut b, "scale", 2, 0.5, 1.5);
    let bias = vec_c(&mut b, "bias", 3, -0.5, 0.5);
    let mean = vec_c(&mut b, "mean", 4, -0.5, 0.5);
    let var = vec_c(&mut b, "var", 5, 0.5, 2.0);
    let bn = b
        .op(
            Op::BatchNorm { epsilon: F32(1e-5) },
            &[conv, scale, bias, mean, var],
        )
        .expect("bn");
    let add = b.op(Op::Binary(BinaryOp::Add), &[bn, skip]).expect("add");
    let relu = b.op(Op::Unary(UnaryOp::Relu), &[add]).expect("relu");
    b.finish(&[("y", relu)]);
    m
}

#[test]
fn unfused_residual_block_matches_interpreter() {
    let m = residual_block(6, 10);
    check_against_interp("residual block", &m, &random_inputs(&m, 21), 1e-5);
}

#[test]
fn executable_is_send_and_sync_and_concurrent_runs_are_bit_identical() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Executable>();

    let m = residual_block(8, 12);
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    let inputs = random_inputs(&m, 4);
    let reference = exe.run(&inputs).expect("runs");
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..20)
                        .map(|_| exe.run(&inputs).expect("runs"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for h in handles {
            for out in h.join().expect("thread finished") {
                let same = out[0]
                    .f32s()
                    .iter()
                    .zip(reference[0].f32s())
                    .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "a concurrent run differs from the first run");
            }
        }
    });
}

#[test]
fn run_with_reuses_a_workspace_and_matches_run() {
    let m = residual_block(4, 7);
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    let inputs = random_inputs(&m, 8);
    let want = exe.run(&inputs).expect("runs");
    let mut ws = exe.workspace();
    let mut out = vec![0.0f32; exe.outputs().next().expect("one output").len()];
    for _ in 0..3 {
        let ins: Vec<Elements> = inputs.iter().map(|t| t.f32s().into()).collect();
        exe.run_with(&ins, &mut [out.as_mut_slice().into()], &mut ws)
            .expect("runs");
        assert_eq!(out, want[0].data);
    }
}

#[test]
fn wrong_inputs_are_errors_not_crashes() {
    let m = residual_block(4, 7);
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    let good = random_inputs(&m, 1);
    // wrong count
    assert!(exe.run(&good[..1]).is_err());
    // wrong shape
    let mut bad = good.clone();
    bad[1] = random(&[1, 4, 7, 6], 2);
    let e = exe.run(&bad).unwrap_err().to_string();
    assert!(e.contains("skip"), "error names the input: {e}");
    // wrong lengths through run_with
    let mut ws = exe.workspace();
    let short = vec![0.0f32; 10];
    let full = good[1].f32s().to_vec();
    let mut out = vec![0.0f32; 4 * 49];
    let r = exe.run_with(
        &[(&short).into(), (&full).into()],
        &mut [(&mut out).into()],
        &mut ws,
    );
    assert!(r.is_err());
    let mut small_out = vec![0.0f32; 3];
    let r = exe.run_with(
        &[(&full).into(), (&full).into()],
        &mut [(&mut small_out).into()],
        &mut ws,
    );
    assert!(r.is_err());
    // a workspace too small for this executable
    let tiny = residual_block(1, 2);
    let tiny_exe = Executable::compile(&tiny, None, &opts()).expect("compiles");
    let mut tiny_ws = tiny_exe.workspace();
    let r = exe.run_with(
        &[(&full).into(), (&full).into()],
        &mut [(&mut out).into()],
        &mut tiny_ws,
    );
    assert!(r.is_err());
    // and the good inputs still work
    assert!(exe.run(&good).is_ok());
}

#[test]
fn unknown_function_is_an_error() {
    let m = residual_block(2, 3);
    assert!(Executable::compile(&m, Some("nope"), &opts()).is_err());
}

/// The thin-path kernel, small enough to read: loop IR and CLIF for a fixed target.
fn thin_path_program() -> lower::Program {
    let mut case = ConvCase::new(4, 4, [5, 6], 3);
    case.attrs.pads = [1; 4];
    let m = fused_conv_module(&case, &add_relu(), &[out_dims(&case)]);
    lower::lower(&m, &m.funcs[0]).expect("lowers")
}

#[test]
fn thin_path_loop_ir_snapshot() {
    let p = thin_path_program();
    common::snapshot_settings("loops")
        .bind(|| insta::assert_snapshot!("thin_path_conv_add_relu", p.dump_loops()));
}

#[test]
fn thin_path_clif_snapshot() {
    // one vector tile of 4 channels x 4 columns, no tails: small enough to read
    let case = ConvCase::new(2, 4, [3, 4], 3);
    let m = fused_conv_module(&case, &add_relu(), &[out_dims(&case)]);
    let p = lower::lower(&m, &m.funcs[0]).expect("lowers");
    let conv = p
        .kernels
        .iter()
        .find(|k| k.name.starts_with("conv2d"))
        .expect("a conv kernel");
    let text = clif_text(conv, &TargetDesc::fixed_avx2_fma()).expect("verifies");
    assert!(text.contains("fma"), "AVX+FMA target uses fma");
    let no_fma = TargetDesc {
        has_fma: false,
        ..TargetDesc::fixed_avx2_fma()
    };
    let plain = clif_text(conv, &no_fma).expect("verifies");
    assert!(
        !plain.contains("fma"),
        "without FMA: fmul + fadd, never a libcall"
    );
    common::snapshot_settings("clif")
        .bind(|| insta::assert_snapshot!("thin_path_conv_add_relu", text));
}

/// A conv whose tiles call the AVX2 micro-kernel: the call, its local sums buffer and the
/// epilogue reading them back, as loop IR and as CLIF (lowering and code generation for
/// a fixed target; nothing here depends on the host).
#[test]
fn micro_kernel_tile_loop_ir_and_clif_snapshots() {
    let case = ConvCase::new(3, 16, [1, 4], 3);
    let m = fused_conv_module(&case, &add_relu(), &[out_dims(&case)]);
    let opts = lower::LowerOptions {
        micro: Some(smelt::microkernels::TileIsa::Avx2.target()),
        ..lower::LowerOptions::default()
    };
    let p = lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
    let conv = p
        .kernels
        .iter()
        .find(|k| k.name.starts_with("conv2d"))
        .expect("a conv kernel");
    let loops = conv.to_string();
    assert!(loops.contains("call conv_tile("), "{loops}");
    let clif = clif_text(conv, &TargetDesc::fixed_avx2_fma()).expect("verifies");
    // the residual's prefetch helper is imported first (fn0), the routine (u0:0) second
    assert!(clif.contains("fn1 = u0:0 sig"), "{clif}");
    assert!(clif.contains("call fn1("), "{clif}");
    assert!(clif.contains("explicit_slot"), "{clif}");
    common::snapshot_settings("loops")
        .bind(|| insta::assert_snapshot!("micro_kernel_conv_add_relu", loops));
    common::snapshot_settings("clif")
        .bind(|| insta::assert_snapshot!("micro_kernel_conv_add_relu", clif));
}

/// The loop IR names only the conv-tile contract; code generation links the chosen ISA's
/// routine for each call's lanes and refuses a call it has no routine for.
#[test]
fn conv_tile_calls_link_the_chosen_isas_routine_or_are_refused() {
    let case = ConvCase::new(3, 64, [1, 4], 3);
    let m = fused_conv_module(&case, &add_relu(), &[out_dims(&case)]);
    let lowered = |isa: smelt::microkernels::TileIsa| {
        let opts = lower::LowerOptions {
            micro: Some(isa.target()),
            ..lower::LowerOptions::default()
        };
        let p = lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
        p.kernels
            .into_iter()
            .find(|k| k.name.starts_with("conv2d"))
            .expect("a conv kernel")
    };
    use smelt::microkernels::TileIsa::{Avx2, Avx512};
    // 64 output channels: AVX-512 calls its 32-lane routine, AVX2 its 16-lane one
    let wide = lowered(Avx512);
    assert!(wide.to_string().contains("lanes=32"), "{wide}");
    let narrow = lowered(Avx2);
    assert!(narrow.to_string().contains("lanes=16"), "{narrow}");
    let avx2 = TargetDesc::fixed_avx2_fma();
    let err = clif_text(&wide, &avx2).unwrap_err().to_string();
    assert!(
        err.contains("conv tile of 32 lanes, which the avx2 routines do not compute"),
        "{err}"
    );
    let none = TargetDesc {
        tiles: None,
        ..avx2
    };
    let err = clif_text(&narrow, &none).unwrap_err().to_string();
    assert!(
        err.contains("no micro-kernel instruction set was chosen"),
        "{err}"
    );
    // the 32-lane routine is the third declared function (u0:2), AVX2's the first
    let avx512 = TargetDesc {
        tiles: Some(Avx512),
        ..avx2
    };
    assert!(clif_text(&wide, &avx512)
        .expect("links")
        .contains("= u0:2 sig"));
    assert!(clif_text(&narrow, &avx2)
        .expect("links")
        .contains("= u0:0 sig"));
}

#[test]
fn equal_kernels_compile_once() {
    // two convs of the same shape and attributes share one kernel
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "twice");
    let x = b.param("x", f32t(&[1, 4, 6, 6]));
    let w1 = b
        .constant("w1", f32t(&[4, 4, 3, 3]), &random_f32(1, 144, -1.0, 1.0))
        .unwrap();
    let w2 = b
        .constant("w2", f32t(&[4, 4, 3, 3]), &random_f32(2, 144, -1.0, 1.0))
        .unwrap();
    let attrs = Conv2dAttrs {
        pads: [1; 4],
        ..Conv2dAttrs::default()
    };
    let y1 = b.op(Op::Conv2d(attrs.clone()), &[x, w1]).unwrap();
    let y2 = b.op(Op::Conv2d(attrs), &[y1, w2]).unwrap();
    b.finish(&[("y", y2)]);
    let p = lower::lower(&m, &m.funcs[0]).expect("lowers");
    assert_eq!(p.steps.len(), 6, "border rows + padded copy + conv, twice");
    assert_eq!(
        p.kernels.len(),
        3,
        "one kernel of each kind, shared by both convs"
    );
    let inputs = vec![random(&[1, 4, 6, 6], 3)];
    check_against_interp("two convs", &m, &inputs, 1e-5);
    let _ = Tensor::zeros(&f32t(&[1]));
}

/// Outputs are bit-identical whatever the thread count: only independent output tiles
/// are split, never a reduction.
#[test]
fn outputs_are_bit_identical_for_any_thread_count() {
    let mut cases = vec![
        (
            "residual tail",
            smelt::models::residual_tail(16, 9, 3).expect("tail"),
        ),
        ("unfused block", residual_block(12, 11)),
    ];
    let mut cfg = smelt::models::ResNetConfig::demo();
    cfg.seed = 5;
    cases.push(("demo resnet", smelt::models::resnet(&cfg).expect("resnet")));
    for (what, m) in cases {
        let mut m = m;
        smelt::optimize(&mut m, &smelt::OptimizeOptions::default(), None).expect("optimizes");
        let inputs = random_inputs(&m, 17);
        let want = smelt_ir::interp::run(&m, &m.funcs[0], &inputs).expect("interprets");
        let mut first: Option<Vec<Tensor>> = None;
        for threads in [1, 2, 3] {
            let o = smelt::CompileOptions { threads, ..opts() };
            let exe = Executable::compile(&m, None, &o).expect("compiles");
            let got = exe.run(&inputs).expect("runs");
            let stats = smelt_ir::ErrorStats::between_tensors(&got[0], &want[0]).expect("shape");
            assert!(
                stats.relative <= 1e-5,
                "{what}: {threads} threads: {stats:?}"
            );
            match &first {
                None => first = Some(got),
                Some(f) => {
                    for (a, b) in got.iter().zip(f) {
                        let same = a
                            .f32s()
                            .iter()
                            .zip(b.f32s())
                            .all(|(x, y)| x.to_bits() == y.to_bits());
                        assert!(same, "{what}: {threads} threads differ from 1 thread");
                    }
                }
            }
        }
    }
}

/// A profiled run returns the same outputs and one entry per kernel call, naming the op.
#[test]
fn profiled_run_reports_every_kernel_call() {
    let m = residual_block(8, 10);
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    let inputs = random_inputs(&m, 2);
    let plain = exe.run(&inputs).expect("runs");
    let (outs, prof) = exe.run_profiled(&inputs).expect("runs");
    assert_eq!(outs[0].data, plain[0].data);
    assert_eq!(prof.len(), exe.kernel_counts().1, "one entry per call");
    let conv = prof
        .iter()
        .find(|p| p.op == "conv2d" && p.kernel.starts_with("conv2d"))
        .expect("the conv's call is named after its op");
    // executed flops: 2·C·9·H·W per output channel computed — the 8 channels, or (on a
    // micro-kernel whose last block is zero-padded) the 16 lanes of one block
    let per_channel = 2 * 8 * 9 * 10 * 10;
    assert!(
        conv.flops % per_channel == 0 && [8, 16].contains(&(conv.flops / per_channel)),
        "conv flops {}: 2·O·C·9·H·W for O = 8 or 16 lanes",
        conv.flops
    );
    assert!(conv.bytes >= 4 * (8 * 10 * 10 + 8 * 8 * 9) as u64);
    assert!(prof.iter().any(|p| p.op == "relu"));
}

/// An executable keeps the weights its kernels read, not the ones lowering only packed:
/// a packed conv holds its packed copy (plus the bias), not the OIHW weights as well.
#[test]
fn executables_do_not_keep_weights_only_lowering_read() {
    // a 1x1 conv: always the packed direct kernel (no Winograd)
    let mut case = ConvCase::new(64, 64, [8, 8], 1);
    case.attrs.pads = [0; 4];
    let m = fused_conv_module(&case, &add_relu(), &[out_dims(&case)]);
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    let weights = 64 * 64 * 4;
    assert!(
        exe.constant_bytes() < 2 * weights,
        "{} bytes of constants for {weights} bytes of weights",
        exe.constant_bytes()
    );
    assert!(
        exe.constant_bytes() >= weights,
        "the packed weights are kept"
    );
}
