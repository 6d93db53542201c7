//! GFLOP/s of the fused Conv3x3→(BN folded)→Add→ReLU tail; prints, never asserts on time.
//! Run: `cargo test --release --test jit_bench -- --ignored --nocapture`.

mod jit_util;

use std::time::Instant;

use jit_util::{f32t, opts, random_inputs};
use smelt::runtime::Executable;
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{Conv2dAttrs, FusedOp, PostOp};
use smelt_ir::weights::random_f32;
use smelt_ir::{BinaryOp, Module, Op, UnaryOp};

fn tail(c: usize, hw: usize) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "tail");
    let x = b.param("x", f32t(&[1, c, hw, hw]));
    let skip = b.param("skip", f32t(&[1, c, hw, hw]));
    let w = b
        .constant(
            "w",
            f32t(&[c, c, 3, 3]),
            &random_f32(1, c * c * 9, -0.1, 0.1),
        )
        .expect("w");
    let bias = b
        .constant("b", f32t(&[c]), &random_f32(2, c, -0.1, 0.1))
        .expect("b");
    let op = Op::Fused(FusedOp {
        anchor: Box::new(Op::Conv2d(Conv2dAttrs {
            pads: [1; 4],
            ..Conv2dAttrs::default()
        })),
        post_ops: vec![
            PostOp::Binary {
                op: BinaryOp::Add,
                acc_is_lhs: true,
            },
            PostOp::Unary(UnaryOp::Relu),
        ],
    });
    let y = b.op(op, &[x, w, bias, skip]).expect("fused");
    b.finish(&[("y", y)]);
    m
}

#[test]
#[ignore = "benchmark: run explicitly with --ignored --nocapture"]
fn fused_tail_gflops() {
    for (c, hw) in [(64, 56), (128, 28), (512, 7)] {
        let m = tail(c, hw);
        let exe = Executable::compile(&m, None, &opts()).expect("compiles");
        let inputs = random_inputs(&m, 1);
        let ins: Vec<&[f32]> = inputs.iter().map(|t| t.data.as_slice()).collect();
        let mut out = vec![0.0f32; c * hw * hw];
        let mut ws = exe.workspace();
        let mut times = Vec::new();
        for i in 0..40 {
            let t = Instant::now();
            exe.run_with(&ins, &mut [out.as_mut_slice()], &mut ws)
                .expect("runs");
            if i >= 5 {
                times.push(t.elapsed().as_secs_f64());
            }
        }
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        let flops = 2.0 * (c * c * 9 * hw * hw) as f64;
        println!(
            "C{c} {hw}x{hw}: median {:.3} ms, {:.1} GFLOP/s (min {:.3} ms); compile {:.2} ms",
            median * 1e3,
            flops / median / 1e9,
            times[0] * 1e3,
            exe.compile_times().total_ms
        );
    }
}

#[test]
#[ignore = "writes the conv kernel's disassembly to $SMELT_DISASM for inspection"]
fn dump_conv_disassembly() {
    let path = std::env::var("SMELT_DISASM").expect("set SMELT_DISASM to an output file");
    let m = tail(64, 56);
    let p = smelt_passes::lower::lower(&m, &m.funcs[0]).expect("lowers");
    let conv = p
        .kernels
        .iter()
        .find(|k| k.name.starts_with("conv2d"))
        .expect("conv kernel");
    let target = smelt::codegen::TargetDesc::host().expect("x86-64 host");
    let text = smelt::codegen::disassemble(conv, &target).expect("compiles");
    std::fs::write(path, text).expect("writable");
}
