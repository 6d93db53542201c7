//! Fusion on whole networks: ResNet-18 and ResNet-50 built in code. Every BN folds, every
//! residual add and relu is absorbed into a conv, and the fusion time is printed (not
//! asserted: timing assertions are flaky on shared machines).

use std::time::Instant;

use smelt::models::{resnet, ResNetConfig};
use smelt_ir::Module;
use smelt_passes::fusion::{fuse_func, FusionOptions};
use smelt_passes::{PassContext, PassManager};

fn op_counts(module: &Module) -> std::collections::BTreeMap<String, usize> {
    let mut counts = std::collections::BTreeMap::new();
    for inst in &module.funcs[0].insts {
        *counts.entry(inst.op.name().to_string()).or_default() += 1;
    }
    counts
}

fn check_network(name: &str, cfg: &ResNetConfig) {
    let module = resnet(cfg).expect("network builds");
    let func = &module.funcs[0];
    let opts = FusionOptions::default();
    let start = Instant::now();
    let mut warnings = Vec::new();
    let (_, report) = fuse_func(func, &module.weights, &opts, &mut warnings).expect("fuses");
    let fuse_ms = start.elapsed().as_secs_f64() * 1e3;
    eprintln!(
        "{name}: fusion (saturate + extract + rebuild) {fuse_ms:.1} ms, {} e-nodes, {} sites",
        report.egraph_nodes,
        report.sites.len()
    );
    assert!(warnings.is_empty(), "{name}: {warnings:?}");
    let mut after = module.clone();
    let mut cx = PassContext::default();
    PassManager::default_pipeline(&opts)
        .run(&mut after, &mut cx)
        .expect("pipeline runs");
    let counts = op_counts(&after);
    for op in ["batch_norm", "add", "relu"] {
        assert_eq!(
            counts.get(op),
            None,
            "{name}: {op} left after fusion: {counts:?}"
        );
    }
}

#[test]
fn resnet18_fuses_every_bn_add_and_relu() {
    check_network("resnet18", &ResNetConfig::resnet18());
}

#[test]
fn resnet50_fuses_every_bn_add_and_relu() {
    check_network("resnet50", &ResNetConfig::resnet50());
}
