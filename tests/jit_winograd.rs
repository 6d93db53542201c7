//! Winograd 3×3 convolutions through the JIT against the interpreter: both forms, sizes
//! that do not tile exactly, batches, bias and fused add+relu, and bit-identical results
//! at 1 and 2 threads.

mod jit_util;

use jit_util::{check_against_interp, opts, random_inputs};
use smelt::{CompileOptions, Executable};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{Conv2dAttrs, FusedOp, PostOp};
use smelt_ir::weights::random_f32;
use smelt_ir::{BinaryOp, Module, Op, TensorType, UnaryOp};
use smelt_passes::lower;

/// One case: batch, channels in/out, spatial size, padding, bias, fused add+relu.
#[derive(Clone, Copy, Debug)]
struct Case {
    n: usize,
    c: usize,
    o: usize,
    hw: [usize; 2],
    pad: usize,
    bias: bool,
    add_relu: bool,
}

fn module(k: Case) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let [h, w] = k.hw;
    let x = b.param("x", TensorType::f32(vec![k.n, k.c, h, w]));
    let (oh, ow) = (h + 2 * k.pad - 2, w + 2 * k.pad - 2);
    let skip = k
        .add_relu
        .then(|| b.param("skip", TensorType::f32(vec![k.n, k.o, oh, ow])));
    // weights of the scale of a He-initialised layer, so outputs are O(1)
    let scale = (2.0 / (9 * k.c) as f32).sqrt() * 1.7;
    let wv: Vec<f32> = random_f32(5, k.o * k.c * 9, -scale, scale);
    let wt = b
        .constant("w", TensorType::f32(vec![k.o, k.c, 3, 3]), &wv)
        .expect("weights");
    let mut operands = vec![x, wt];
    if k.bias {
        let bv = random_f32(6, k.o, -0.5, 0.5);
        let bt = b
            .constant("b", TensorType::f32(vec![k.o]), &bv)
            .expect("bias");
        operands.push(bt);
    }
    let conv = Op::Conv2d(Conv2dAttrs {
        pads: [k.pad; 4],
        ..Conv2dAttrs::default()
    });
    let y = match skip {
        Some(s) => {
            operands.push(s);
            let fused = Op::Fused(FusedOp {
                anchor: Box::new(conv),
                post_ops: vec![
                    PostOp::Binary {
                        op: BinaryOp::Add,
                        acc_is_lhs: true,
                    },
                    PostOp::Unary(UnaryOp::Relu),
                ],
            });
            b.op(fused, &operands).expect("fused conv type-checks")
        }
        None => b.op(conv, &operands).expect("conv type-checks"),
    };
    b.finish(&[("y", y)]);
    m
}

/// The kernel names the lowering chose.
fn kernels(m: &Module) -> Vec<String> {
    let p = lower::lower(m, &m.funcs[0]).expect("lowers");
    p.kernels.iter().map(|k| k.name.clone()).collect()
}

fn uses(m: &Module, form: &str) -> bool {
    kernels(m)
        .iter()
        .any(|k| k.starts_with(&format!("winograd{form}_output")))
}

fn check(k: Case) -> Module {
    let m = module(k);
    check_against_interp(&format!("{k:?}"), &m, &random_inputs(&m, 23), 1e-4);
    m
}

fn case(n: usize, c: usize, o: usize, hw: [usize; 2]) -> Case {
    Case {
        n,
        c,
        o,
        hw,
        pad: 1,
        bias: false,
        add_relu: false,
    }
}

#[test]
fn f4_on_exact_and_ragged_tiles() {
    // 56² (14 tiles per row: 3 groups of 4 and 2 scalar tiles), 28², and sizes that are
    // not multiples of 4 (partial tiles at the bottom and right)
    for hw in [[56, 56], [28, 28], [30, 27], [19, 33]] {
        let m = check(case(1, 32, 32, hw));
        assert!(uses(&m, "4"), "{hw:?}: expected F(4×4): {:?}", kernels(&m));
    }
}

#[test]
fn batch_bias_and_fused_add_relu() {
    for k in [
        Case {
            bias: true,
            ..case(2, 32, 64, [28, 28])
        },
        Case {
            bias: true,
            add_relu: true,
            ..case(2, 36, 32, [23, 26])
        },
        Case {
            add_relu: true,
            pad: 0,
            ..case(1, 64, 32, [30, 30])
        },
    ] {
        let m = check(k);
        assert!(
            kernels(&m).iter().any(|n| n.starts_with("winograd")),
            "{k:?}: {:?}",
            kernels(&m)
        );
    }
}

#[test]
fn small_images_use_f2() {
    // 7² and 8² with many channels: F(4×4) would stream α²/9 = 4× the weights for 4
    // tiles, so the cost model picks F(2×2) (4 tiles per row: one vector group, and a
    // partial last tile at 7²)
    for k in [
        case(1, 64, 64, [8, 8]),
        Case {
            bias: true,
            add_relu: true,
            ..case(1, 128, 128, [7, 7])
        },
        Case {
            bias: true,
            ..case(2, 64, 64, [9, 10])
        },
    ] {
        let m = check(k);
        assert!(uses(&m, "2"), "{k:?}: expected F(2×2): {:?}", kernels(&m));
    }
}

#[test]
fn medium_images_use_f4() {
    // 14²: 4 tiles per row, the last one partial (a vector group with lane stores); 512
    // channels: the error of the F4 transforms grows with the reduction length
    for k in [
        Case {
            bias: true,
            add_relu: true,
            ..case(1, 256, 256, [14, 14])
        },
        case(1, 512, 512, [14, 14]),
    ] {
        let m = check(k);
        assert!(uses(&m, "4"), "{k:?}: expected F(4×4): {:?}", kernels(&m));
    }
}

#[test]
fn rows_of_fewer_than_4_tiles_run_on_scalars() {
    // 3 tiles per row: the input transform takes its scalar path, the output transform
    // stores its last columns lane by lane (F2: a last tile paired with one past the row)
    for (k, form) in [
        (
            Case {
                bias: true,
                add_relu: true,
                ..case(2, 64, 64, [12, 12])
            },
            "4",
        ),
        (
            Case {
                add_relu: true,
                ..case(1, 128, 128, [6, 6])
            },
            "2",
        ),
    ] {
        let m = check(k);
        assert!(uses(&m, form), "{k:?}: expected F{form}: {:?}", kernels(&m));
    }
}

#[test]
fn channels_not_multiple_of_4_fall_back() {
    // 30 output channels: the packed product needs multiples of 4, so the direct path runs
    let k = Case {
        bias: true,
        ..case(1, 32, 30, [28, 28])
    };
    let m = check(k);
    assert!(!uses(&m, "4") && !uses(&m, "2"), "{:?}", kernels(&m));
    // input channels need not be a multiple of 4
    let m = check(case(1, 34, 32, [28, 28]));
    assert!(uses(&m, "4") || uses(&m, "2"), "{:?}", kernels(&m));
}

/// Output channels in quads that no micro-kernel routine's lanes divide (24, 40): on a
/// micro-kernel target the product's last block is zero-padded and the output transform
/// reads the real channels; even tile counts (64 and 100 tiles) pad the planes of `V`
/// and `M` to an odd stride. Checked on every kernel choice, and the lowering for a
/// micro-kernel target shown to pick Winograd.
#[test]
fn ragged_output_channels_on_micro_kernels() {
    for (o, hw) in [
        (24, [32, 32]),
        (40, [28, 28]),
        (24, [40, 40]),
        (20, [27, 30]),
    ] {
        let k = Case {
            bias: true,
            add_relu: true,
            ..case(1, 64, o, hw)
        };
        let m = check(k);
        let opts = lower::LowerOptions {
            micro: Some(smelt::microkernels::TileIsa::Avx512.target()),
            ..Default::default()
        };
        let p = lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
        let names: Vec<&str> = p.kernels.iter().map(|k| k.name.as_str()).collect();
        assert!(
            names.iter().any(|n| n.starts_with("winograd")),
            "{k:?}: {names:?}"
        );
    }
}

#[test]
fn tiny_convs_stay_direct() {
    // the thin-path convs (4 channels of 5×6 in tests/jit.rs, 16 of 14² in
    // tests/cases/thin_path) keep the direct path and its snapshots
    for k in [case(1, 4, 4, [5, 6]), case(1, 16, 16, [14, 14])] {
        let m = module(k);
        assert!(
            kernels(&m).iter().all(|n| !n.starts_with("winograd")),
            "{k:?}: {:?}",
            kernels(&m)
        );
    }
}

#[test]
fn one_and_two_threads_are_bit_identical() {
    for k in [
        Case {
            bias: true,
            add_relu: true,
            ..case(2, 32, 32, [30, 27])
        },
        case(1, 256, 256, [14, 14]),
    ] {
        let m = module(k);
        let inputs = random_inputs(&m, 31);
        let run = |threads: usize| {
            let o = CompileOptions { threads, ..opts() };
            let exe = Executable::compile(&m, None, &o).expect("compiles");
            exe.run(&inputs).expect("runs")
        };
        let (one, two) = (run(1), run(2));
        assert_eq!(one[0].data, two[0].data, "{k:?}");
    }
}

/// `ConvAlgorithm::Direct` turns Winograd off: the same conv lowers to the direct
/// kernel, and both agree with each other within Winograd's tolerance.
#[test]
fn direct_option_lowers_without_winograd() {
    let m = module(case(1, 32, 32, [28, 28]));
    assert!(uses(&m, "4"), "auto picks F4 at 28²");
    let direct = lower::LowerOptions {
        conv: lower::ConvAlgorithm::Direct,
        ..lower::LowerOptions::default()
    };
    let p = lower::lower_with(&m, &m.funcs[0], &direct).expect("lowers");
    assert!(
        p.kernels.iter().all(|k| !k.name.starts_with("winograd")),
        "direct lowering still has Winograd kernels"
    );
    let inputs = random_inputs(&m, 5);
    let run = |conv| {
        let o = smelt::CompileOptions { conv, ..opts() };
        let exe = smelt::Executable::compile(&m, None, &o).expect("compiles");
        exe.run(&inputs).expect("runs").remove(0)
    };
    let (wino, direct) = (
        run(smelt::ConvAlgorithm::Auto),
        run(smelt::ConvAlgorithm::Direct),
    );
    let stats = smelt_ir::ErrorStats::between_tensors(&wino, &direct).expect("same shape");
    assert!(stats.relative <= 1e-4, "Winograd vs direct: {stats:?}");
}

/// The kernel names of `convs` chained 512→512 3×3 convs at 7², lowered for the AVX-512
/// micro-kernel (lowering only: nothing runs, so any host will do).
fn chain_kernels(convs: usize) -> Vec<String> {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "chain");
    let mut y = b.param("x", TensorType::f32(vec![1, 512, 7, 7]));
    for i in 0..convs {
        let wv = random_f32(i as u64, 512 * 512 * 9, -0.02, 0.02);
        let w = b
            .constant(&format!("w{i}"), TensorType::f32(vec![512, 512, 3, 3]), &wv)
            .expect("weights");
        let conv = Op::Conv2d(Conv2dAttrs {
            pads: [1; 4],
            ..Conv2dAttrs::default()
        });
        y = b.op(conv, &[y, w]).expect("conv type-checks");
    }
    b.finish(&[("y", y)]);
    let opts = lower::LowerOptions {
        micro: Some(smelt::microkernels::TileIsa::Avx512.target()),
        ..lower::LowerOptions::default()
    };
    let p = lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
    p.kernels.iter().map(|k| k.name.clone()).collect()
}

/// Weights that fit in the last-level cache stay there between runs, so one 512·7² conv
/// (9.4 MB) takes F(2×2) — fewer flops, its 16.8 MB of `U` streamed from cache — while in
/// a function of three (28 MB: every weight comes from memory on every run) the direct
/// convolution streams fewer bytes and wins.
#[test]
fn weights_that_stay_cached_change_the_choice() {
    let one = chain_kernels(1);
    assert!(
        one.iter().any(|k| k.starts_with("winograd2_output")),
        "one conv: {one:?}"
    );
    let three = chain_kernels(3);
    assert!(
        three.iter().all(|k| !k.starts_with("winograd")),
        "three convs: {three:?}"
    );
}
