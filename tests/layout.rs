//! The layout pass and channel-blocked (NCHW16c) activations: which values it puts in
//! blocks and why not others, the printed result, the JIT against the interpreter with
//! and without blocks, and the errors for blocked forms nothing computes.

mod common;
mod jit_util;

use jit_util::{add_relu, check_against_interp, f32t, kernel_choices, opts, random_inputs};
use smelt::microkernels::TileIsa;
use smelt::{CompileOptions, Executable, Kernels, Layouts};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::loops::TileTarget;
use smelt_ir::op::{
    Conv2dAttrs, CoordinateMode, FusedOp, NearestMode, Pool2dAttrs, PostOp, ResizeAttrs, ResizeMode,
};
use smelt_ir::text::{self, PrintOptions};
use smelt_ir::weights::random_f32;
use smelt_ir::{BinaryOp, Layout, Module, Op, UnaryOp, Value, F32};
use smelt_passes::layout::assign_layouts;

const BLOCKS: Layout = Layout::Blocked { axis: 1, block: 16 };

/// A conv of `x` (`cin` → `cout` channels, `k`×`k`, stride `s`, padded to keep the
/// size) with bias, then `post` with `extra` operands: fused when `post` is not empty.
#[allow(clippy::too_many_arguments)]
fn conv(
    b: &mut FuncBuilder,
    x: Value,
    (cin, cout): (usize, usize),
    k: usize,
    s: usize,
    post: &[PostOp],
    extra: &[Value],
    seed: u64,
) -> Value {
    let wdims = [cout, cin, k, k];
    let n = wdims.iter().product();
    let scale = (1.0 / (cin * k * k) as f32).sqrt();
    let w = b
        .constant(
            &format!("w{seed}"),
            f32t(&wdims),
            &random_f32(seed, n, -scale, scale),
        )
        .expect("weight");
    let bias = b
        .constant(
            &format!("b{seed}"),
            f32t(&[cout]),
            &random_f32(seed + 1, cout, -0.2, 0.2),
        )
        .expect("bias");
    let attrs = Conv2dAttrs {
        strides: [s, s],
        pads: [k / 2; 4],
        ..Conv2dAttrs::default()
    };
    let mut operands = vec![x, w, bias];
    operands.extend_from_slice(extra);
    let op = if post.is_empty() {
        Op::Conv2d(attrs)
    } else {
        Op::Fused(FusedOp {
            anchor: Box::new(Op::Conv2d(attrs)),
            post_ops: post.to_vec(),
        })
    };
    b.op(op, &operands).expect("conv type-checks")
}

fn relu() -> Vec<PostOp> {
    vec![PostOp::Unary(UnaryOp::Relu)]
}

/// Three fused ResNet bottleneck blocks as fusion leaves them, on `n` images of
/// `hw`×`hw`:
/// the first with a 1×1 projection, the second plain, the third with a stride-2
/// projection; a per-channel scale on the second block's output, whose result is a
/// function result.
fn bottlenecks(n: usize, hw: usize) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 48, hw, hw]));
    let gamma = b.param("gamma", f32t(&[1, 64, 1, 1]));
    // block 1: projection 48 → 64 beside 48 → 16 → 16 → 64
    let proj = conv(&mut b, x, (48, 64), 1, 1, &[], &[], 10);
    let a = conv(&mut b, x, (48, 16), 1, 1, &relu(), &[], 20);
    let a = conv(&mut b, a, (16, 16), 3, 1, &relu(), &[], 30);
    let y1 = conv(&mut b, a, (16, 64), 1, 1, &add_relu(), &[proj], 40);
    // block 2: 64 → 32 → 32 → 64 on the identity
    let c = conv(&mut b, y1, (64, 32), 1, 1, &relu(), &[], 50);
    let c = conv(&mut b, c, (32, 32), 3, 1, &relu(), &[], 60);
    let y2 = conv(&mut b, c, (32, 64), 1, 1, &add_relu(), &[y1], 70);
    // a per-channel scale: a broadcast operand the blocked epilogue reads along channels
    let mul = [PostOp::Binary {
        op: BinaryOp::Mul,
        acc_is_lhs: true,
    }];
    let scaled = conv(&mut b, y2, (64, 64), 1, 1, &mul, &[gamma], 80);
    // block 3: stride-2 projection 64 → 128 beside 64 → 32 → 32 (stride 2) → 128
    let proj2 = conv(&mut b, scaled, (64, 128), 1, 2, &[], &[], 90);
    let e = conv(&mut b, scaled, (64, 32), 1, 1, &relu(), &[], 100);
    let e = conv(&mut b, e, (32, 32), 3, 2, &relu(), &[], 110);
    let y3 = conv(&mut b, e, (32, 128), 1, 1, &add_relu(), &[proj2], 120);
    b.finish(&[("y", y3)]);
    m
}

/// The result names of the instructions the pass put in blocks, by weight seed order.
fn blocked_values(m: &Module, micro: Option<TileTarget>) -> Vec<usize> {
    let f = assign_layouts(&m.funcs[0], micro).expect("something is blocked");
    f.insts
        .iter()
        .enumerate()
        .filter(|(_, i)| i.ty.layout == BLOCKS)
        .map(|(k, _)| k)
        .collect()
}

#[test]
fn layout_pass_blocks_values_whose_writers_and_readers_all_compute_on_blocks() {
    let m = bottlenecks(1, 10);
    let f = &m.funcs[0];
    let laid = assign_layouts(f, Some(TileIsa::Avx2.target())).expect("blocks");
    let name = |k: usize| format!("{}", laid.insts[k].ty);
    let conv_results: Vec<(usize, String)> = laid
        .insts
        .iter()
        .enumerate()
        .filter(|(_, i)| !matches!(i.op, Op::Const(_)))
        .map(|(k, _)| (k, name(k)))
        .collect();
    let blocked: Vec<&String> = conv_results
        .iter()
        .filter(|(_, t)| t.contains("nchw16c"))
        .map(|(_, t)| t)
        .collect();
    // every conv's result — the reducing convs' results read by 3×3 convs (which copy
    // 16-channel runs), the 3×3 results written by the direct conv's epilogue or
    // Winograd's output transform — but block 3's output (a function result) and its
    // projection (that output's residual)
    assert_eq!(
        blocked,
        [
            "tensor<1x64x10x10xf32, nchw16c>",
            "tensor<1x16x10x10xf32, nchw16c>",
            "tensor<1x16x10x10xf32, nchw16c>",
            "tensor<1x64x10x10xf32, nchw16c>",
            "tensor<1x32x10x10xf32, nchw16c>",
            "tensor<1x32x10x10xf32, nchw16c>",
            "tensor<1x64x10x10xf32, nchw16c>",
            "tensor<1x64x10x10xf32, nchw16c>",
            "tensor<1x32x10x10xf32, nchw16c>",
            "tensor<1x32x5x5xf32, nchw16c>",
        ],
        "{conv_results:?}"
    );
    assert!(laid
        .results
        .iter()
        .all(|r| laid.type_of(r.value).layout == Layout::RowMajor));
    assert!(laid.params.iter().all(|p| p.ty.layout == Layout::RowMajor));
    // without a micro-kernel nothing computes on blocks
    assert!(assign_layouts(f, None).is_none());
    // the same choice whichever micro-kernel
    assert_eq!(
        blocked_values(&m, Some(TileIsa::Avx2.target())),
        blocked_values(&m, Some(TileIsa::Avx512.target()))
    );
}

#[test]
fn laid_out_module_prints_and_parses_back() {
    let mut m = bottlenecks(1, 10);
    let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
    m.funcs[0] = laid;
    smelt_ir::verify::verify_module(&m).expect("the laid-out module verifies");
    let print = PrintOptions {
        elide_weights: true,
        ..PrintOptions::default()
    };
    let printed = text::print(&m, &print);
    common::snapshot_settings("layout").bind(|| insta::assert_snapshot!("bottlenecks", printed));
    let full = text::print(&m, &PrintOptions::default());
    let back = text::parse(&full, "bottlenecks.tir").expect("the printed module parses");
    assert_eq!(text::print(&back, &PrintOptions::default()), full);
}

/// Runs `m` compiled for `kernels` with the layout pass and without: the blocked
/// executable's loop IR, and the bits of both results.
fn blocked_and_row_major(
    m: &Module,
    inputs: &[smelt_ir::Tensor],
    kernels: Kernels,
) -> (String, Vec<u32>, Vec<u32>) {
    let run = |layouts| {
        let o = CompileOptions {
            kernels,
            layouts,
            ..opts()
        };
        let exe = Executable::compile(m, None, &o).expect("compiles");
        let bits: Vec<u32> = exe
            .run(inputs)
            .expect("runs")
            .iter()
            .flat_map(|t| t.f32s().iter().map(|v| v.to_bits()))
            .collect();
        (exe.dump_loops().to_string(), bits)
    };
    let ((loops, blocked), (_, plain)) = (run(Layouts::Auto), run(Layouts::RowMajor));
    (loops, blocked, plain)
}

#[test]
fn blocked_activations_match_the_interpreter_and_row_major_bit_for_bit() {
    for (n, hw) in [(1, 10), (1, 7), (1, 16), (2, 12)] {
        let m = bottlenecks(n, hw);
        let inputs = random_inputs(&m, 5);
        check_against_interp(&format!("bottlenecks {n}×{hw}²"), &m, &inputs, 1e-5);
        // the blocked reduction walks channels in the planar order, so the sums are
        // the same floats
        for kernels in kernel_choices() {
            let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
            if hw == 16 && kernels != Kernels::Cranelift {
                // both 3×3 forms read blocks: the direct one's channels-last copy from
                // blocks, and Winograd's padding of 16-channel pixels (a left pad of one
                // pixel is 16 floats); Winograd's output transform writes them
                assert!(loops.contains("c16_t1l1_"), "no direct 3×3 conv on blocks");
                assert!(loops.contains("winograd"), "no Winograd conv at 16²");
                assert!(loops.contains("_t1l16_"), "Winograd's input not in blocks");
                let blocked_output = |l: &str| l.contains("_output_") && l.contains("_out16c");
                assert!(
                    loops
                        .lines()
                        .any(|l| l.contains("winograd") && blocked_output(l)),
                    "Winograd's output not in blocks"
                );
            }
            assert_eq!(blocked, plain, "{n}×{hw}² {kernels:?}");
        }
    }
}

#[test]
fn blocked_intermediates_are_returned_row_major() {
    let m = bottlenecks(1, 10);
    let inputs = random_inputs(&m, 6);
    let o = CompileOptions {
        kernels: Kernels::Avx2,
        keep_intermediates: true,
        ..opts()
    };
    let exe = Executable::compile(&m, None, &o).expect("compiles");
    let (_, kept) = exe.run_keeping(&inputs).expect("runs");
    let want = smelt_ir::interp::run_keep_all(&m, &m.funcs[0], &inputs).expect("interpreter");
    let mut compared = 0;
    for k in &kept {
        let w = &want[k.value.index()];
        assert_eq!(k.tensor.ty, w.ty, "value {:?}", k.value);
        let stats = smelt_ir::ErrorStats::between_tensors(&k.tensor, w).expect("same shape");
        assert!(
            stats.relative <= 1e-5,
            "value {:?}: {}",
            k.value,
            stats.relative
        );
        compared += 1;
    }
    assert!(compared > 10, "only {compared} intermediates kept");
}

/// A ResNet stem on `n` images of `hw`×`hw` — a 7×7 stride-2 conv with relu, a 3×3
/// stride-2 max pool — then a basic block whose residual is the pool's output, and a
/// 1×1 conv for the result.
fn stem(n: usize, hw: usize) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 3, hw, hw]));
    let c = conv(&mut b, x, (3, 32), 7, 2, &relu(), &[], 300);
    let pool = Pool2dAttrs {
        kernel: [3, 3],
        strides: [2, 2],
        pads: [1; 4],
        dilations: [1, 1],
        ceil_mode: false,
        layout: Layout::RowMajor,
    };
    let p = b.op(Op::MaxPool2d(pool), &[c]).expect("pool type-checks");
    let a = conv(&mut b, p, (32, 32), 3, 1, &relu(), &[], 310);
    let y = conv(&mut b, a, (32, 32), 3, 1, &add_relu(), &[p], 320);
    let z = conv(&mut b, y, (32, 16), 1, 1, &[], &[], 330);
    b.finish(&[("z", z)]);
    m
}

#[test]
fn max_pool_reads_and_writes_channel_blocks() {
    let m = stem(1, 32);
    let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
    let pools: Vec<String> = laid
        .insts
        .iter()
        .filter(|i| matches!(i.op, Op::MaxPool2d(_)))
        .map(|i| i.ty.to_string())
        .collect();
    assert_eq!(pools, ["tensor<1x32x8x8xf32, nchw16c>"]);
    // every conv result but the function's
    let blocked = laid.insts.iter().filter(|i| i.ty.layout == BLOCKS).count();
    assert_eq!(
        blocked, 4,
        "the stem conv, the pool, the block's two 3×3 results"
    );
    for (n, hw) in [(1, 32), (2, 48)] {
        let m = stem(n, hw);
        let inputs = random_inputs(&m, 9);
        check_against_interp(&format!("stem {n}×{hw}²"), &m, &inputs, 1e-5);
        for kernels in kernel_choices() {
            let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
            if kernels != Kernels::Cranelift {
                let blocked_pool =
                    |l: &str| l.contains("@max_pool2d_3x3_s2_") && l.contains("c16 ");
                assert!(loops.lines().any(blocked_pool), "no max pool on blocks");
            }
            assert_eq!(blocked, plain, "{n}×{hw}² {kernels:?}");
        }
    }
}

/// A projection and an expanding conv with its residual, then a global average pool
/// with a per-channel bias: the pool reads the blocks.
fn pooled_head(c: usize) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[2, 24, 6, 6]));
    let shift = b.param("shift", f32t(&[1, c, 1, 1]));
    let proj = conv(&mut b, x, (24, c), 1, 1, &[], &[], 1);
    let a = conv(&mut b, x, (24, 16), 3, 1, &relu(), &[], 2);
    let y = conv(&mut b, a, (16, c), 1, 1, &add_relu(), &[proj], 3);
    let add = [PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: true,
    }];
    let pooled = b
        .op(
            Op::Fused(FusedOp {
                anchor: Box::new(Op::GlobalAvgPool),
                post_ops: add.to_vec(),
            }),
            &[y, shift],
        )
        .expect("pool type-checks");
    b.finish(&[("pooled", pooled)]);
    m
}

#[test]
fn global_average_pool_reads_channel_blocks() {
    let m = pooled_head(48);
    let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
    let blocked = laid.insts.iter().filter(|i| i.ty.layout == BLOCKS).count();
    assert_eq!(
        blocked, 3,
        "the projection, the 3×3 result and the block output"
    );
    check_against_interp("pooled head", &m, &random_inputs(&m, 7), 1e-5);
}

#[test]
fn blocked_forms_nothing_computes_are_errors() {
    // laid out for a micro-kernel, then compiled for Cranelift code only
    let mut m = bottlenecks(1, 10);
    m.funcs[0] = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
    let o = CompileOptions {
        kernels: Kernels::Cranelift,
        ..opts()
    };
    let e = Executable::compile(&m, None, &o).expect_err("cranelift tiles take no blocks");
    let msg = e.to_string();
    assert!(
        msg.contains("nchw16c") && msg.contains("micro-kernel"),
        "{msg}"
    );
    // a blocked result of a grouped conv
    let src = "const @w : tensor<16x8x3x3xf32> = dense<0.5>

func @main(%x: tensor<1x16x6x6xf32>) -> (y: tensor<1x16x6x6xf32>) {
  %w = const @w : tensor<16x8x3x3xf32>
  %y = conv2d %x, %w {pads = [1, 1, 1, 1], groups = 2, layout = nchw16c} : tensor<1x16x6x6xf32, nchw16c>
  %z = relu %y : tensor<1x16x6x6xf32>
  return %z : tensor<1x16x6x6xf32>
}
";
    let m = text::parse(src, "blocked_grouped.tir")
        .expect("parses: the type rule allows a blocked conv result");
    let e = Executable::compile(&m, None, &opts()).expect_err("grouped convs write no blocks");
    assert!(
        e.to_string()
            .contains("ungrouped convs with output channels in"),
        "{e}"
    );
    // a max pool on blocks that the blocked kernel does not compute (2×2 windows)
    let src = "const @w : tensor<16x16x1x1xf32> = dense<0.5>

func @main(%x: tensor<1x16x8x8xf32>) -> (y: tensor<1x16x4x4xf32>) {
  %w = const @w : tensor<16x16x1x1xf32>
  %a = conv2d %x, %w {layout = nchw16c} : tensor<1x16x8x8xf32, nchw16c>
  %p = max_pool2d %a {kernel = [2, 2], strides = [2, 2], layout = nchw16c} : tensor<1x16x4x4xf32, nchw16c>
  %y = conv2d %p, %w : tensor<1x16x4x4xf32>
  return %y : tensor<1x16x4x4xf32>
}
";
    let m = text::parse(src, "blocked_pool.tir").expect("parses: the pool's layout attribute");
    let e = Executable::compile(&m, None, &opts()).expect_err("2x2 pools take no blocks");
    assert!(e.to_string().contains("no kernel for these layouts"), "{e}");
    // a blocked residual into a row-major result (the relu beside it reads blocks)
    let src = "const @w : tensor<16x16x1x1xf32> = dense<0.5>

func @main(%x: tensor<1x16x4x4xf32>) -> (y: tensor<1x16x4x4xf32>, z: tensor<1x16x4x4xf32>) {
  %w = const @w : tensor<16x16x1x1xf32>
  %a = conv2d %x, %w {layout = nchw16c} : tensor<1x16x4x4xf32, nchw16c>
  %y = fused conv2d %x, %w post [add(_, %a)] : tensor<1x16x4x4xf32>
  %z = relu %a : tensor<1x16x4x4xf32>
  return %y, %z : tensor<1x16x4x4xf32>, tensor<1x16x4x4xf32>
}
";
    let m = text::parse(src, "mixed.tir").expect("parses: the interpreter reads any layout");
    let e = Executable::compile(&m, None, &opts()).expect_err("no kernel reads these");
    assert!(e.to_string().contains("no kernel for these layouts"), "{e}");
}

/// A depthwise `k`×`k` conv of `x` (`c` channels, stride `s`, dilation `d`, padded by
/// `d·(k/2)`) with bias, fused with `post`.
#[allow(clippy::too_many_arguments)]
fn depthwise(
    b: &mut FuncBuilder,
    x: Value,
    c: usize,
    k: usize,
    (s, d): (usize, usize),
    post: &[PostOp],
    seed: u64,
) -> Value {
    let wdims = [c, 1, k, k];
    let w = b
        .constant(
            &format!("w{seed}"),
            f32t(&wdims),
            &random_f32(seed, c * k * k, -0.5, 0.5),
        )
        .expect("weight");
    let bias = b
        .constant(
            &format!("b{seed}"),
            f32t(&[c]),
            &random_f32(seed + 1, c, -0.2, 0.2),
        )
        .expect("bias");
    let attrs = Conv2dAttrs {
        strides: [s, s],
        pads: [d * (k / 2); 4],
        dilations: [d, d],
        groups: c,
        ..Conv2dAttrs::default()
    };
    let op = Op::Fused(FusedOp {
        anchor: Box::new(Op::Conv2d(attrs)),
        post_ops: post.to_vec(),
    });
    b.op(op, &[x, w, bias]).expect("depthwise conv type-checks")
}

/// MobileNet's inverted residual on `n` images of `hw`×`hw`: a 1×1 conv expanding 16
/// channels to `mid` with relu, a depthwise `k`×`k` conv (stride and dilation `sd`) with
/// relu, a 1×1 projection to 24 channels (not a whole number of blocks).
fn inverted_residual(n: usize, hw: usize, k: usize, sd: (usize, usize), mid: usize) -> Module {
    inverted_residual_with(n, hw, k, sd, mid, &relu())
}

/// [`inverted_residual`] with `post` after the depthwise conv instead of relu.
fn inverted_residual_with(
    n: usize,
    hw: usize,
    k: usize,
    sd: (usize, usize),
    mid: usize,
    post: &[PostOp],
) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 16, hw, hw]));
    let e = conv(&mut b, x, (16, mid), 1, 1, &relu(), &[], 400);
    let dw = depthwise(&mut b, e, mid, k, sd, post, 410);
    let y = conv(&mut b, dw, (mid, 24), 1, 1, &[], &[], 420);
    b.finish(&[("y", y)]);
    m
}

/// Whether a depthwise kernel on channel blocks in the loop-IR dump `loops` has `call`.
fn depthwise_kernels_call(loops: &str, call: &str) -> bool {
    loops
        .split("kernel @")
        .filter(|k| k.starts_with("conv2d_depthwise_c16_"))
        .any(|k| k.contains(call))
}

#[test]
fn depthwise_convs_read_and_write_channel_blocks() {
    // the expanding conv's result and the depthwise conv's are in blocks: the projection
    // reads blocks though its 24 output channels are not whole blocks
    // (with 72 channels: four whole blocks and a partial one of 8)
    for mid in [32, 72] {
        let m = inverted_residual(1, 9, 3, (1, 1), mid);
        let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
        let types: Vec<String> = laid.insts.iter().map(|i| i.ty.to_string()).collect();
        let blocked: Vec<&String> = types.iter().filter(|t| t.contains("nchw16c")).collect();
        let want = format!("tensor<1x{mid}x9x9xf32, nchw16c>");
        assert_eq!(blocked, [&want, &want], "{types:?}");
    }
    // windows, strides and dilations; planes whose every output is a border one (4² with
    // 5×5 windows), odd and even sizes; batch 2; whole and partial last blocks
    for (n, hw, k, sd, mid) in [
        (1, 9, 3, (1, 1), 32),
        (2, 12, 3, (2, 1), 32),
        (1, 13, 5, (1, 1), 32),
        (1, 14, 5, (2, 1), 32),
        (1, 4, 5, (1, 1), 32),
        (1, 11, 3, (1, 2), 32),
        (2, 7, 7, (2, 1), 32),
        (1, 9, 3, (1, 1), 24),
        (2, 10, 3, (2, 1), 72),
        (1, 7, 5, (1, 1), 120),
        (2, 6, 3, (1, 1), 4),
    ] {
        let what = format!("inverted residual {n}×{hw}² k{k} s,d {sd:?}, {mid} channels");
        let m = inverted_residual(n, hw, k, sd, mid);
        let inputs = random_inputs(&m, 11);
        check_against_interp(&what, &m, &inputs, 1e-5);
        for kernels in kernel_choices() {
            let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
            // (4 channels are too few for the expanding conv's micro-kernel tiles: it
            // writes NCHW, and the depthwise conv reads it)
            let on_blocks = loops.contains("@conv2d_depthwise_c16_");
            let want = kernels != Kernels::Cranelift && mid >= 16;
            assert_eq!(on_blocks, want, "{what} {kernels:?}");
            // on blocks, the native routine computes every row (AVX-512 hosts use the
            // AVX2 one)
            let native = loops.contains("call blocked_depthwise_row(");
            assert_eq!(native, on_blocks, "{what} {kernels:?}\n{loops}");
            // two blocks of one image are too few trips for threads: its interior rows
            // are the parallel loop, the border rows a kernel of their own
            if native && (n, hw, mid) == (1, 9, 32) {
                for part in ["_fused_interior", "_fused_border"] {
                    assert!(loops.contains(part), "{what}: no {part} kernel\n{loops}");
                }
            }
            // the row routine applies the relu before it stores, no pass after it; a
            // partial block (72 channels: four whole blocks and 8 lanes) is computed as a
            // whole one, its padded lanes zero, by the same kernels
            let in_row = depthwise_kernels_call(&loops, "act=relu)");
            assert_eq!(in_row, native && mid >= 16, "{what} {kernels:?}\n{loops}");
            assert!(
                !depthwise_kernels_call(&loops, "call store_relu_rows("),
                "{what} {kernels:?}: a store pass\n{loops}"
            );
            if native {
                assert!(
                    !loops.contains("_partial"),
                    "{what}: a partial kernel\n{loops}"
                );
            }
            // on AVX-512 the expansion's 72 channels are two 32-lane blocks and a 16-lane
            // tail (not five blocks of 16)
            if kernels == Kernels::Avx512 && mid == 72 {
                assert!(
                    loops.contains("_o72x32t16p"),
                    "{what}: no tail block\n{loops}"
                );
            }
            // bias first, then the taps in order, as the row-major Cranelift kernels sum
            // (the native row routine of 5×5 and wider windows adds the bias last)
            if k == 3 {
                assert_eq!(blocked, plain, "{what} {kernels:?}");
            }
        }
    }
    // MobileNetV3's hard-swish after the depthwise conv: the row routine's, bit for bit
    // the Cranelift epilogue's, on whole blocks and on a partial one computed whole
    let hard_swish = [PostOp::Unary(UnaryOp::HardSwish)];
    let mut native_hard_swish = 0;
    for (n, hw, mid) in [(1, 9, 32), (2, 8, 48), (1, 7, 24)] {
        let what = format!("inverted residual {n}×{hw}², hard-swish, {mid} channels");
        let m = inverted_residual_with(n, hw, 3, (1, 1), mid, &hard_swish);
        let inputs = random_inputs(&m, 19);
        check_against_interp(&what, &m, &inputs, 1e-5);
        for kernels in kernel_choices() {
            let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
            let native = loops.contains("call blocked_depthwise_row(");
            let in_row = depthwise_kernels_call(&loops, "act=hardswish)");
            assert_eq!(in_row, native && mid >= 16, "{what} {kernels:?}\n{loops}");
            native_hard_swish += usize::from(in_row);
            assert_eq!(blocked, plain, "{what} {kernels:?}");
        }
    }
    if cfg!(target_arch = "x86_64") {
        assert!(
            native_hard_swish >= 2,
            "no hard-swish ran through the row routine"
        );
    }
}

/// [`inverted_residual`] with a squeeze-and-excitation gate after the depthwise conv:
/// global average pool, 1×1 conv to 8 channels with relu, 1×1 conv back with a
/// sigmoid, and the depthwise result times the gate (`gate_first`: `mul(gate, x)`, as
/// torchvision writes it).
/// An inverted residual block with an SE gate on `n` images of `hw`², `mid` channels
/// wide; the gated activations are a function result too when `gated_is_result` (so
/// they must be row-major).
fn inverted_residual_se(
    n: usize,
    hw: usize,
    gate_first: bool,
    mid: usize,
    gated_is_result: bool,
) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 16, hw, hw]));
    let e = conv(&mut b, x, (16, mid), 1, 1, &relu(), &[], 500);
    let dw = depthwise(&mut b, e, mid, 3, (1, 1), &relu(), 510);
    let pooled = b.op(Op::GlobalAvgPool, &[dw]).expect("pool type-checks");
    let squeeze = conv(&mut b, pooled, (mid, 8), 1, 1, &relu(), &[], 520);
    let sigmoid = [PostOp::Unary(UnaryOp::Sigmoid)];
    let gate = conv(&mut b, squeeze, (8, mid), 1, 1, &sigmoid, &[], 530);
    let operands = if gate_first { [gate, dw] } else { [dw, gate] };
    let scaled = b
        .op(Op::Binary(BinaryOp::Mul), &operands)
        .expect("mul type-checks");
    let y = conv(&mut b, scaled, (mid, 24), 1, 1, &[], &[], 540);
    match gated_is_result {
        true => b.finish(&[("y", y), ("gated", scaled)]),
        false => b.finish(&[("y", y)]),
    }
    m
}

#[test]
fn squeeze_and_excitation_gates_read_channel_blocks() {
    // the depthwise result stays in blocks: the pool and the gating mul read them; the
    // mul's result is in blocks too (the projection reads them), unless it is a function
    // result as well
    let blocked = "tensor<1x32x9x9xf32, nchw16c>";
    for (gated_is_result, gated) in [(false, blocked), (true, "tensor<1x32x9x9xf32>")] {
        let m = inverted_residual_se(1, 9, true, 32, gated_is_result);
        let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
        let types: Vec<String> = laid
            .insts
            .iter()
            .filter(|i| i.ty.dims == [1, 32, 9, 9])
            .map(|i| i.ty.to_string())
            .collect();
        assert_eq!(
            types,
            [blocked, blocked, gated],
            "the expansion, the depthwise conv, the gated result (also a result: \
             {gated_is_result})"
        );
    }
    // both operand orders; rows in whole vectors and with a tail of 3, 2 or 1 columns;
    // whole and partial last blocks
    // (the gated value also a result: the mul changes the layout as it computes)
    for (n, hw, gate_first, mid, gated_is_result) in [
        (1, 9, true, 32, false),
        (2, 8, false, 32, true),
        (1, 14, true, 32, true),
        (2, 7, false, 32, false),
        (1, 9, true, 72, false),
        (2, 6, false, 120, true),
        (2, 6, false, 120, false),
    ] {
        let what = format!(
            "SE block {n}×{hw}², gate first {gate_first}, {mid} channels, gated result \
             {gated_is_result}"
        );
        let m = inverted_residual_se(n, hw, gate_first, mid, gated_is_result);
        check_against_interp(&what, &m, &random_inputs(&m, 13), 1e-5);
        for kernels in kernel_choices() {
            let o = CompileOptions { kernels, ..opts() };
            let exe = Executable::compile(&m, None, &o).expect("compiles");
            let loops = exe.dump_loops().to_string();
            let kernel = match gated_is_result {
                true => "@mul_from_c16_",
                false => "@mul_c16_",
            };
            assert_eq!(
                loops.contains(kernel),
                kernels != Kernels::Cranelift,
                "{what} {kernels:?}: {kernel}"
            );
        }
    }
}

/// An FPN merge on `n` images: a coarse 1×1 lateral conv of `c` channels at `hw`², upsampled
/// ×2 (nearest, floor, asymmetric: each pixel repeated), added to the fine lateral conv
/// at `2·hw`², then a 3×3 conv of the sum.
fn fpn_merge(n: usize, hw: usize, c: usize) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let coarse = b.param("coarse", f32t(&[n, 32, hw, hw]));
    let fine = b.param("fine", f32t(&[n, 16, 2 * hw, 2 * hw]));
    let lat = conv(&mut b, coarse, (32, c), 1, 1, &[], &[], 600);
    let up = ResizeAttrs {
        sizes: vec![n, c, 2 * hw, 2 * hw],
        scales: vec![F32(1.0), F32(1.0), F32(2.0), F32(2.0)],
        mode: ResizeMode::Nearest(NearestMode::Floor),
        coordinate: CoordinateMode::Asymmetric,
        ..ResizeAttrs::default()
    };
    let up = b.op(Op::Resize(up), &[lat]).expect("resize type-checks");
    let add = [PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: true,
    }];
    let merged = conv(&mut b, fine, (16, c), 1, 1, &add, &[up], 610);
    let y = conv(&mut b, merged, (c, 16), 3, 1, &relu(), &[], 620);
    b.finish(&[("y", y)]);
    m
}

#[test]
fn nearest_upsampling_repeats_channel_blocks() {
    // the lateral result, its upsampling and the merged sum are in blocks (the sum's
    // residual must be laid out as the sum)
    let m = fpn_merge(1, 5, 32);
    let laid = assign_layouts(&m.funcs[0], Some(TileIsa::Avx2.target())).expect("blocks");
    // the resize's layout attribute verifies, prints and parses back
    let mut laid_module = m.clone();
    laid_module.funcs[0] = laid.clone();
    smelt_ir::verify::verify_module(&laid_module).expect("the laid-out module verifies");
    let full = text::print(&laid_module, &PrintOptions::default());
    assert!(full.contains("asymmetric, layout = nchw16c}"), "{full}");
    let back = text::parse(&full, "fpn.tir").expect("the printed module parses");
    assert_eq!(text::print(&back, &PrintOptions::default()), full);
    let blocked: Vec<String> = laid
        .insts
        .iter()
        .filter(|i| i.ty.layout == BLOCKS)
        .map(|i| i.ty.to_string())
        .collect();
    assert_eq!(
        blocked,
        [
            "tensor<1x32x5x5xf32, nchw16c>",
            "tensor<1x32x10x10xf32, nchw16c>",
            "tensor<1x32x10x10xf32, nchw16c>"
        ]
    );
    // whole blocks; with 24 channels (a partial last block) the sum's 3×3 conv reads
    // whole blocks only, so the sum, its residual and the upsampling stay NCHW
    for (n, hw, c) in [(1, 5, 32), (2, 4, 48), (1, 6, 24)] {
        let what = format!("FPN merge {n}×{hw}², {c} channels");
        let m = fpn_merge(n, hw, c);
        let inputs = random_inputs(&m, 17);
        check_against_interp(&what, &m, &inputs, 1e-5);
        for kernels in kernel_choices() {
            let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
            let repeats_blocks = loops.contains("@resize_repeat_c16_");
            let want = kernels != Kernels::Cranelift && c % 16 == 0;
            assert_eq!(repeats_blocks, want, "{what} {kernels:?}");
            assert_eq!(blocked, plain, "{what} {kernels:?}");
        }
    }
}

/// A 16 → 32 → 16 bottleneck whose 1×1 convs end in `first` and `last` (`last` may read
/// the bottleneck's input, a 1×1 conv's result, as a residual), each before a depthwise
/// conv so that it writes channel blocks.
fn pointwise_pair(n: usize, hw: usize, first: &[PostOp], last: &[PostOp]) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 16, hw, hw]));
    let r = conv(&mut b, x, (16, 16), 1, 1, &relu(), &[], 690);
    let e = conv(&mut b, r, (16, 32), 1, 1, first, &[], 700);
    let dw = depthwise(&mut b, e, 32, 3, (1, 1), &relu(), 710);
    let extra: &[Value] = match last.first() {
        Some(PostOp::Binary { .. }) => &[r],
        _ => &[],
    };
    let p = conv(&mut b, dw, (32, 16), 1, 1, last, extra, 720);
    let d = depthwise(&mut b, p, 16, 3, (1, 1), &relu(), 730);
    let y = conv(&mut b, d, (16, 32), 1, 1, &[], &[], 740);
    b.finish(&[("y", y)]);
    m
}

#[test]
fn whole_block_tiles_store_through_the_native_routine_bit_for_bit() {
    let add = PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: false,
    };
    let silu = PostOp::Unary(UnaryOp::Silu);
    let hard_swish = PostOp::Unary(UnaryOp::HardSwish);
    // the epilogues the store routines' formula applies (none, ReLU, a residual, both;
    // hard-swish alone and after a residual) — finished by the tile itself, in
    // registers —, and one after a native SiLU, which the store routine finishes
    let cases: [(&[PostOp], &[PostOp], &[&str]); 6] = [
        (&[], &[], &["finish=identity"]),
        (
            &relu(),
            &[add],
            &["finish=relu", "residual: ", "finish=identity"],
        ),
        // (the SiLU takes the bias, and nothing is left for a store pass)
        (
            &[silu],
            &add_relu(),
            &["call silu_rows", "finish=relu", "residual: "],
        ),
        (
            &relu(),
            &[add, PostOp::Unary(UnaryOp::Relu)],
            &["finish=relu", "residual: "],
        ),
        (&[hard_swish], &[], &["finish=hardswish", "finish=identity"]),
        (
            &relu(),
            &[add, hard_swish],
            &["finish=hardswish", "residual: "],
        ),
    ];
    let mut native = 0;
    for (k, (first, last, routines)) in cases.into_iter().enumerate() {
        for (n, hw) in [(1, 9), (2, 12)] {
            let what = format!("case {k}, {n}×{hw}²");
            let m = pointwise_pair(n, hw, first, last);
            let inputs = random_inputs(&m, 13);
            check_against_interp(&what, &m, &inputs, 1e-5);
            for kernels in kernel_choices() {
                let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
                // the stack's sums and the Cranelift epilogue give the same floats
                assert_eq!(blocked, plain, "{what} {kernels:?}");
                // AVX2's 16-lane tiles are one block each, AVX-512's 32-lane ones two
                // (each block a call of the store routine where one runs)
                if kernels != Kernels::Cranelift {
                    for r in routines {
                        assert!(loops.contains(r), "{what}: no `{r}`\n{loops}");
                    }
                    if routines.iter().all(|r| !r.starts_with("call")) {
                        // (the kernels writing channel blocks: the last conv writes
                        // NCHW planes through its own routine)
                        let blocked = kernels_named(&loops, "conv2d_packed")
                            .filter(|k| k.lines().next().is_some_and(|l| l.contains("_out16c")));
                        for k in blocked {
                            assert!(!k.contains("store"), "{what}: a store pass\n{k}");
                        }
                    }
                    native += 1;
                }
            }
        }
    }
    if cfg!(target_arch = "x86_64") {
        // AVX2 always; AVX-512 too where the host has it
        let isas = if smelt::microkernels::has_avx512f() {
            2
        } else {
            1
        };
        assert_eq!(
            native,
            2 * 6 * isas,
            "every case ran with each native tile ISA (2 shapes × 6 cases)"
        );
    }
}

/// A 1×1 conv of 16 → `mid` channels ending in `post`, its result read by a depthwise
/// conv (so it is written in channel blocks) and then projected back to 16 channels.
fn expansion(n: usize, hw: usize, mid: usize, post: &[PostOp]) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 16, hw, hw]));
    let e = conv(&mut b, x, (16, mid), 1, 1, post, &[], 900);
    let dw = depthwise(&mut b, e, mid, 3, (1, 1), &relu(), 910);
    let y = conv(&mut b, dw, (mid, 16), 1, 1, &[], &[], 920);
    b.finish(&[("y", y)]);
    m
}

/// The text of the kernels whose names start with `prefix`.
fn kernels_named<'a>(loops: &'a str, prefix: &'a str) -> impl Iterator<Item = &'a str> {
    loops
        .split("kernel @")
        .filter(move |k| k.starts_with(prefix))
}

#[test]
fn partial_last_tiles_write_their_blocks_directly() {
    // A partial last tile whose lanes are all stored — 24 channels on AVX-512's 32
    // lanes, 8 (of 40) on 16 — sums straight into the result and runs the store routine
    // there (no stack buffer, no Cranelift epilogue) when its zero-padded lanes stay
    // zero through the epilogue; a sigmoid (σ(0) = ½) keeps the stack and the Cranelift
    // epilogue that stores zeros.
    let silu = PostOp::Unary(UnaryOp::Silu);
    let sigmoid = PostOp::Unary(UnaryOp::Sigmoid);
    let hard_swish = PostOp::Unary(UnaryOp::HardSwish);
    let cases: [(&[PostOp], bool); 4] = [
        (&relu(), true),
        (&[hard_swish], true),
        (&[silu], true),
        (&[sigmoid], false),
    ];
    let mut direct = 0;
    for mid in [24, 40] {
        for (post, zero_to_zero) in cases {
            let what = format!("16 → {mid} then {post:?}");
            let m = expansion(1, 10, mid, post);
            let inputs = random_inputs(&m, 21);
            check_against_interp(&what, &m, &inputs, 1e-5);
            for kernels in kernel_choices() {
                if kernels == Kernels::Cranelift {
                    continue;
                }
                let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
                assert_eq!(blocked, plain, "{what} {kernels:?}");
                let expansion = format!("_g1_o{mid}x");
                let texts: Vec<&str> = kernels_named(&loops, "conv2d_packed_1x16x")
                    .filter(|k| k.contains(&expansion))
                    .collect();
                assert_eq!(
                    texts.len(),
                    1,
                    "{what} {kernels:?}: one expansion kernel\n{loops}"
                );
                let on_stack = texts[0].contains("%local");
                assert_eq!(on_stack, !zero_to_zero, "{what} {kernels:?}\n{}", texts[0]);
                if zero_to_zero {
                    // ReLU and hard-swish finished by the tile, the SiLU by its routine
                    let finish = if post == [silu] {
                        "silu_rows("
                    } else {
                        "finish="
                    };
                    assert!(
                        texts[0].contains(finish),
                        "{what}: no `{finish}`\n{}",
                        texts[0]
                    );
                    direct += 1;
                }
            }
        }
    }
    if cfg!(target_arch = "x86_64") {
        // AVX2 always, AVX-512 where the host has it
        assert!(direct >= 2 * 3, "direct partial tiles ran {direct} times");
    }
}

/// A 3×3 conv of 32 → 64 channels on `hw`×`hw` images (Winograd's size) ending in `post`
/// (whose add reads a 1×1 conv of the input), read by a 1×1 conv so that it writes
/// channel blocks.
fn winograd_in_blocks(n: usize, hw: usize, post: &[PostOp]) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 32, hw, hw]));
    let r = conv(&mut b, x, (32, 32), 1, 1, &relu(), &[], 950);
    let extra: Vec<Value> = match post.first() {
        Some(PostOp::Binary { .. }) => vec![conv(&mut b, x, (32, 64), 1, 1, &[], &[], 960)],
        _ => Vec::new(),
    };
    let w = conv(&mut b, r, (32, 64), 3, 1, post, &extra, 970);
    let y = conv(&mut b, w, (64, 16), 1, 1, &[], &[], 980);
    b.finish(&[("y", y)]);
    m
}

#[test]
fn winograd_transforms_in_blocks_run_the_native_routines() {
    // The output transform of a Winograd conv writing channel blocks, with every
    // epilogue the store routines apply (the bias alone, a ReLU, a residual add and
    // ReLU, a SiLU first), on exact and ragged tiles (the last tile row and column
    // partial), one and two images: the native routine and the store routines give the
    // Cranelift transform's bits and match the interpreter.
    let add = PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: false,
    };
    let silu = PostOp::Unary(UnaryOp::Silu);
    let posts: [&[PostOp]; 4] = [&[], &relu(), &[add, PostOp::Unary(UnaryOp::Relu)], &[silu]];
    let mut native = 0;
    for post in posts {
        for (n, hw) in [(1, 20), (2, 18), (1, 10)] {
            let what = format!("{post:?} on {n}×{hw}²");
            let m = winograd_in_blocks(n, hw, post);
            let inputs = random_inputs(&m, 31);
            check_against_interp(&what, &m, &inputs, 1e-4);
            for kernels in kernel_choices() {
                let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
                assert_eq!(blocked, plain, "{what} {kernels:?}");
                let output: Vec<&str> = loops
                    .split("kernel @")
                    .filter(|k| k.starts_with("winograd") && k.contains("_output_"))
                    .collect();
                assert!(
                    !output.is_empty(),
                    "{what}: no Winograd output kernel\n{loops}"
                );
                // the input transform reads the blocks the first conv wrote
                if kernels != Kernels::Cranelift {
                    let input = loops
                        .split("kernel @")
                        .find(|k| k.starts_with("winograd") && k.contains("_input_"))
                        .unwrap_or_else(|| panic!("{what}: no Winograd input kernel\n{loops}"));
                    assert!(
                        input.contains("call winograd_input_row("),
                        "{what}\n{input}"
                    );
                }
                for k in output {
                    // (Cranelift's product computes on row-major values, not blocks)
                    let in_blocks = k.contains("_out16c");
                    assert_eq!(in_blocks, kernels != Kernels::Cranelift, "{what}\n{k}");
                    let routine = k.contains("call winograd_output_row(");
                    assert_eq!(
                        routine,
                        kernels != Kernels::Cranelift,
                        "{what} {kernels:?}\n{k}"
                    );
                    native += usize::from(routine);
                }
            }
        }
    }
    if cfg!(target_arch = "x86_64") {
        assert!(
            native >= 4 * 3,
            "the native output routine ran {native} times"
        );
    }
}

/// A 1×1 conv (16 → 24 channels, a partial second block) whose result is the function's,
/// laid out by channel planes, with `post` applied.
fn planar_result(n: usize, hw: usize, post: &[PostOp]) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "main");
    let x = b.param("x", f32t(&[n, 16, hw, hw]));
    let y = conv(&mut b, x, (16, 24), 1, 1, post, &[], 760);
    b.finish(&[("y", y)]);
    m
}

#[test]
fn tiles_of_a_planar_result_store_through_the_native_routine() {
    let hard_swish = PostOp::Unary(UnaryOp::HardSwish);
    let sigmoid = PostOp::Unary(UnaryOp::Sigmoid);
    // (a sigmoid runs natively on whole tiles with the bias, padded to whole tiles for
    // the partial second block, and nothing is left for the store but the transpose)
    let cases: [(&[PostOp], &[&str]); 4] = [
        (&[], &["call store_planes("]),
        (&relu(), &["call store_relu_planes("]),
        (&[hard_swish], &["call store_hardswish_planes("]),
        (
            &[sigmoid],
            &["call sigmoid_rows(", "call store_planes(", "bias_padded"],
        ),
    ];
    let mut native = 0;
    for (post, routines) in cases {
        // whole 8×8 blocks of the routine, and pixels past them
        for (n, hw) in [(1, 8), (2, 11)] {
            let what = format!("{routines:?} {n}×{hw}²");
            let m = planar_result(n, hw, post);
            let inputs = random_inputs(&m, 17);
            check_against_interp(&what, &m, &inputs, 1e-5);
            for kernels in kernel_choices() {
                let (loops, blocked, plain) = blocked_and_row_major(&m, &inputs, kernels);
                assert_eq!(blocked, plain, "{what} {kernels:?}");
                if kernels == Kernels::Avx2 {
                    for r in routines {
                        assert!(loops.contains(r), "{what}: no `{r}`\n{loops}");
                    }
                    assert!(
                        !loops.contains("shuffle("),
                        "{what}: a transposing epilogue"
                    );
                    native += 1;
                }
            }
        }
    }
    if cfg!(target_arch = "x86_64") {
        assert_eq!(
            native,
            4 * 2,
            "every case ran with AVX2 tiles (4 cases × 2 shapes)"
        );
    }
}
