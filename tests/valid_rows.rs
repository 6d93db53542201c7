//! Products that stop at a run's valid rows (issue #23's run-time extents): an
//! attention block and its feed-forward layer compiled at a padded length, its row
//! loops limited by the padding analysis of the optimized function, run at every valid
//! length the bucket serves — each time after a run that filled its memory with NaN —
//! against the interpreter at exactly that length.

use smelt::ir::{ErrorStats, Module, Tensor, TensorData, TensorType};
use smelt::runtime::{Elements, ElementsMut};
use smelt::{CompileOptions, Executable, OptimizeOptions};
use smelt_ir::padding::padded_rows;

/// Hidden size: one 32-lane panel of every projection.
const D: usize = 32;
/// The feed-forward layer's width: four 32-lane panels, the up-projection's kernel
/// parallel over them, each stopping at the valid rows and clearing its own columns.
const F: usize = 128;
/// The bucket, and the shortest length it serves: a 56-row block and an 8-row rest,
/// so a run of 33 valid rows computes rows up to 42 (whole register blocks of 14) and
/// skips the others, which must then be cleared — without the clearing this test
/// fails with NaN from the poisoned run.
const PADDED: usize = 64;
const SHORT: usize = 33;

/// Weights from a fixed xorshift stream, in `[-0.5, 0.5)`.
fn weights(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

/// One attention block at sequence length `len` in smelt's text form: Q, K and V
/// projections, scores masked by `(1 − mask) · −10⁴` (the exporters' additive mask),
/// softmax, `P·V`, a residual; then a feed-forward layer (up-projection, ReLU,
/// down-projection) and its residual.
fn attention(len: usize) -> Module {
    let dense_of = |seed: u64, n: usize| {
        let values: Vec<String> = weights(seed, n).iter().map(|v| format!("{v:?}")).collect();
        format!("dense<[{}]>", values.join(", "))
    };
    let dense = |seed: u64| dense_of(seed, D * D);
    let text = format!(
        "const @wq : tensor<{D}x{D}xf32> = {q}
const @wk : tensor<{D}x{D}xf32> = {k}
const @wv : tensor<{D}x{D}xf32> = {v}
const @one : tensor<f32> = dense<1.0>
const @low : tensor<f32> = dense<-10000.0>
const @wu : tensor<{D}x{F}xf32> = {u}
const @wd : tensor<{F}x{D}xf32> = {d}
func @main(%x: tensor<1x{len}x{D}xf32>, %mask: tensor<1x1x{len}xf32>) -> (out: tensor<1x{len}x{D}xf32>, hidden: tensor<1x{len}x{F}xf32>) {{
  %0 = const @wq : tensor<{D}x{D}xf32>
  %1 = matmul %x, %0 : tensor<1x{len}x{D}xf32>
  %2 = const @wk : tensor<{D}x{D}xf32>
  %3 = matmul %x, %2 : tensor<1x{len}x{D}xf32>
  %4 = const @wv : tensor<{D}x{D}xf32>
  %5 = matmul %x, %4 : tensor<1x{len}x{D}xf32>
  %6 = transpose %3 {{perm = [0, 2, 1]}} : tensor<1x{D}x{len}xf32>
  %7 = matmul %1, %6 : tensor<1x{len}x{len}xf32>
  %8 = const @one : tensor<f32>
  %9 = sub %8, %mask : tensor<1x1x{len}xf32>
  %10 = const @low : tensor<f32>
  %11 = mul %9, %10 : tensor<1x1x{len}xf32>
  %12 = add %7, %11 : tensor<1x{len}x{len}xf32>
  %13 = softmax %12 {{axis = 2}} : tensor<1x{len}x{len}xf32>
  %14 = matmul %13, %5 : tensor<1x{len}x{D}xf32>
  %15 = add %14, %x : tensor<1x{len}x{D}xf32>
  %16 = const @wu : tensor<{D}x{F}xf32>
  %17 = matmul %15, %16 : tensor<1x{len}x{F}xf32>
  %18 = relu %17 : tensor<1x{len}x{F}xf32>
  %19 = const @wd : tensor<{F}x{D}xf32>
  %20 = matmul %18, %19 : tensor<1x{len}x{D}xf32>
  %21 = add %20, %15 : tensor<1x{len}x{D}xf32>
  return %21, %18 : tensor<1x{len}x{D}xf32>, tensor<1x{len}x{F}xf32>
}}
",
        q = dense(1),
        k = dense(2),
        v = dense(3),
        u = dense_of(4, D * F),
        d = dense_of(5, F * D),
    );
    smelt::ir::text::parse(&text, "attention.smelt").expect("the attention block parses")
}

fn optimized(len: usize) -> Module {
    let mut m = attention(len);
    smelt::driver::optimize(&mut m, &OptimizeOptions::default(), None).expect("optimizes");
    m
}

/// `x` of `valid` positions (the rest `fill`) and its mask, at `len` positions.
fn inputs(len: usize, valid: usize, fill: f32) -> Vec<Tensor> {
    let values = weights(7, len * D);
    let x: Vec<f32> = (0..len * D)
        .map(|i| if i / D < valid { values[i] } else { fill })
        .collect();
    let mask: Vec<f32> = (0..len).map(|i| f32::from(u8::from(i < valid))).collect();
    vec![
        Tensor {
            ty: TensorType::new(smelt::ir::DType::F32, vec![1, len, D]),
            data: TensorData::F32(x),
        },
        Tensor {
            ty: TensorType::new(smelt::ir::DType::F32, vec![1, 1, len]),
            data: TensorData::F32(mask),
        },
    ]
}

#[test]
fn products_stop_at_the_valid_rows_and_clear_the_rest() {
    let (big, small) = (optimized(PADDED), optimized(SHORT));
    let rows = padded_rows(&big, &small, PADDED, SHORT).expect("the block pads");
    let exe = Executable::compile_padded(&big, &rows, &CompileOptions::default())
        .expect("compiles at the padded length");
    assert_eq!(exe.padded_rows(), Some(PADDED));
    // the three projections, the scores, the product by V and the feed-forward
    // layer's two products stop at the valid rows
    let loops = exe.dump_loops();
    let steps = loops.split("steps:").nth(1).expect("a steps section");
    let limited = steps.lines().filter(|l| l.contains("_valid_rows")).count();
    match exe.tile_isa() {
        Some(_) => assert_eq!(limited, 7, "{loops}"),
        // the Cranelift GEMM has no row blocks to stop: nothing is limited, and the
        // results below still hold
        None => assert_eq!(limited, 0, "{loops}"),
    }
    // a run of fewer valid rows executes fewer flops, one of all of them the compiled
    // length's
    assert_eq!(exe.executed_flops_at(PADDED), exe.executed_flops());
    if exe.tile_isa().is_some() {
        assert!(exe.executed_flops_at(SHORT) < exe.executed_flops());
    }
    let mut checked = 0;
    for valid in SHORT..=PADDED {
        // NaN in every padded row of the input: the run fills the arena with NaN rows
        let poisoned = inputs(PADDED, valid, f32::NAN);
        let _ = exe.run(&poisoned).expect("a run on NaN rows");
        // then the same sequence padded with zeros, as a padded run is
        let padded = inputs(PADDED, valid, 0.0);
        let ins: Vec<Elements> = padded.iter().map(|t| Elements::of(&t.data)).collect();
        let (mut out, mut hidden) = (vec![f32::NAN; PADDED * D], vec![f32::NAN; PADDED * F]);
        let mut outs = [ElementsMut::F32(&mut out), ElementsMut::F32(&mut hidden)];
        exe.run_valid_rows_into(valid, &ins, &mut outs)
            .expect("a run of valid rows");
        // the model at exactly `valid` positions, by the interpreter
        let exact = attention(valid);
        let func = exact.entry().expect("an entry function");
        let want = smelt::ir::interp::run(&exact, func, &inputs(valid, valid, 0.0))
            .expect("the interpreter runs");
        for ((name, width, values), want) in [("out", D, &out), ("hidden", F, &hidden)]
            .into_iter()
            .zip(&want)
        {
            let got = Tensor {
                ty: TensorType::new(smelt::ir::DType::F32, vec![1, valid, width]),
                data: TensorData::F32(values[..valid * width].to_vec()),
            };
            let err = ErrorStats::between_tensors(&got, want).expect("comparable");
            assert!(err.relative <= 1e-5, "{name}, valid {valid}: {err:?}");
            // rows past the valid ones are finite: computed, or cleared by the products
            // (the feed-forward layer's up-projection clears each panel's columns)
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{name}, valid {valid}: a padded row holds a non-finite value"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, PADDED - SHORT + 1);
    // more valid rows than the compiled length is an error naming both
    let padded = inputs(PADDED, PADDED, 0.0);
    let ins: Vec<Elements> = padded.iter().map(|t| Elements::of(&t.data)).collect();
    let (mut out, mut hidden) = (vec![0f32; PADDED * D], vec![0f32; PADDED * F]);
    let mut outs = [ElementsMut::F32(&mut out), ElementsMut::F32(&mut hidden)];
    let e = exe
        .run_valid_rows_into(PADDED + 1, &ins, &mut outs)
        .expect_err("too many valid rows")
        .to_string();
    assert!(e.contains("65 valid rows") && e.contains("64"), "{e}");
}
