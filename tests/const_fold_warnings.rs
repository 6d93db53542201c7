//! const_fold warns, naming the batch norm, when folding it scales conv weights by more
//! than 1e4 (a near-zero running variance), and stays quiet for ordinary statistics.

use smelt::ir::text;
use smelt::OptimizeOptions;

fn tail(var: &str) -> String {
    format!(
        "const @w : tensor<2x2x1x1xf32> = dense<[1.0, 0.5, -0.5, 1.0]>
const @g : tensor<2xf32> = dense<1.0>
const @b : tensor<2xf32> = dense<0.0>
const @m : tensor<2xf32> = dense<0.0>
const @v : tensor<2xf32> = dense<[{var}, 1.0]>
func @f(%x: tensor<1x2x3x3xf32>) -> tensor<1x2x3x3xf32> {{
  %w = const @w : tensor<2x2x1x1xf32>
  %g = const @g : tensor<2xf32>
  %b = const @b : tensor<2xf32>
  %m = const @m : tensor<2xf32>
  %v = const @v : tensor<2xf32>
  %c = conv2d %x, %w : tensor<1x2x3x3xf32>
  %n = batch_norm %c, %g, %b, %m, %v {{epsilon = 1.0e-12}} : tensor<1x2x3x3xf32>
  return %n : tensor<1x2x3x3xf32>
}}
"
    )
}

fn warnings(var: &str) -> Vec<smelt::ir::Diagnostic> {
    let mut module = text::parse(&tail(var), "bn.tir").expect("parses");
    let cx = smelt::optimize(&mut module, &OptimizeOptions::default(), None).expect("optimizes");
    cx.warnings
}

#[test]
fn near_zero_variance_warns_with_the_batch_norm_location() {
    let w = warnings("1.0e-12");
    let amp: Vec<_> = w.iter().filter(|d| d.code == "bn-fold-amplifies").collect();
    assert_eq!(amp.len(), 1, "{w:?}");
    assert!(amp[0].to_string().contains("bn.tir"), "{}", amp[0]);
}

#[test]
fn ordinary_variance_does_not_warn() {
    assert!(warnings("0.5")
        .iter()
        .all(|d| d.code != "bn-fold-amplifies"));
}
