//! The fusion benchmark: time of fusion (saturate + extract + rebuild) and of const_fold
//! and dce on ResNet-50 built in code — medians of several runs, printed, never asserted
//! (timing assertions are flaky on shared machines). Run it with
//! `cargo test --release --test fusion_time -- --ignored --nocapture`; the numbers are
//! recorded in benches/RESULTS.md ("Fusion and const_fold time").

use std::time::Instant;

use smelt::models::{resnet, ResNetConfig};
use smelt_ir::Module;
use smelt_passes::fusion::{fuse_func, FusionOptions};
use smelt_passes::{PassContext, PassManager};

/// Runs `f` `runs` times; returns the median wall time in milliseconds.
fn median_ms(runs: usize, mut f: impl FnMut()) -> f64 {
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn run_passes(module: &Module, names: &[&str]) -> Module {
    let mut m = module.clone();
    PassManager::from_names(names, &FusionOptions::default())
        .expect("known passes")
        .run(&mut m, &mut PassContext::default())
        .expect("passes run");
    m
}

fn bench(name: &str, cfg: &ResNetConfig) {
    let module = resnet(cfg).expect("network builds");
    let func = &module.funcs[0];
    let opts = FusionOptions::default();
    let fuse = median_ms(9, || {
        let mut warnings = Vec::new();
        let (out, _) = fuse_func(func, &module.weights, &opts, &mut warnings).expect("fuses");
        assert!(!out.insts.is_empty());
    });
    let fused = run_passes(&module, &["fusion"]);
    let fold = median_ms(5, || {
        run_passes(&fused, &["const_fold"]);
    });
    let folded = run_passes(&fused, &["const_fold"]);
    let dce = median_ms(5, || {
        run_passes(&folded, &["dce"]);
    });
    let weights: usize = module.weights.iter().map(|(_, w)| w.data.len_bytes()).sum();
    eprintln!(
        "{name}: fusion {fuse:.1} ms, const_fold {fold:.1} ms, dce {dce:.1} ms \
         ({} instructions, {:.1} MB of weights)",
        func.insts.len(),
        weights as f64 / 1e6
    );
}

#[test]
#[ignore = "a benchmark: run with --ignored --nocapture"]
fn resnet50_fusion_and_const_fold_time() {
    bench("resnet18", &ResNetConfig::resnet18());
    bench("resnet50", &ResNetConfig::resnet50());
}
