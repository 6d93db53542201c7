//! The interpreter runs a whole ResNet-50 (224², batch 1, random weights): the output has
//! the right shape and is finite. Run with `--nocapture` to see the elapsed time, which
//! the interpreter's budget (≤ 15 s in the release profile) is judged by.

use std::time::Instant;

use smelt::ir::weights::random_f32;
use smelt::ir::{interp, Tensor, TensorType};
use smelt::models::{resnet, ResNetConfig};

#[test]
fn resnet50_runs_and_gives_finite_logits() {
    let module = resnet(&ResNetConfig::resnet50()).expect("builds");
    let func = &module.funcs[0];
    let input =
        Tensor::new([1, 3, 224, 224], random_f32(7, 3 * 224 * 224, -1.0, 1.0)).expect("input");
    let start = Instant::now();
    let out = interp::run(&module, func, &[input]).expect("runs");
    println!(
        "interpreter: ResNet-50 224x224 batch 1 in {:.2?}",
        start.elapsed()
    );
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].ty, TensorType::f32([1, 1000]));
    assert!(out[0].f32s().iter().all(|v| v.is_finite()));
    // Random but not degenerate: the logits are not all equal.
    let (lo, hi) = out[0]
        .f32s()
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(lo, hi), &v| {
            (lo.min(v), hi.max(v))
        });
    assert!(hi > lo, "logits are constant: {lo}");
}
