//! The compile driver through its public entry points: `smelt::compile` and
//! `smelt::compile_file` take every option (fusion switches and rules, pass pipeline,
//! threads, kernels, pinned shapes) and honour it, instead of compiling with defaults.

use smelt::ir::text::{self, PrintOptions};
use smelt::ir::Tensor;
use smelt::{CompileOptions, Error, Kernels, Options};

fn tail() -> smelt::ir::Module {
    smelt::models::residual_tail(8, 6, 3).expect("builds")
}

fn zeros(exe: &smelt::Executable) -> Vec<Tensor> {
    exe.inputs().iter().map(|i| Tensor::zeros(&i.ty)).collect()
}

#[test]
fn fusion_switches_rules_and_pipelines_reach_the_passes() {
    let model = tail();
    let (fused, report) = smelt::compile(&model, &Options::default()).expect("compiles");
    let sites: usize = report.fusion_reports.iter().map(|r| r.sites.len()).sum();
    assert!(sites > 0, "the tail fuses by default");

    let mut off = Options::default();
    off.optimize.fusion.enabled = false;
    let (unfused, _) = smelt::compile(&model, &off).expect("compiles");
    assert!(
        unfused.kernel_counts().1 > fused.kernel_counts().1,
        "--no-fuse runs more kernels: {:?} vs {:?}",
        unfused.kernel_counts(),
        fused.kernel_counts()
    );

    // every rule that fired, disabled: nothing fuses
    let mut rules: Vec<String> = report
        .fusion_reports
        .iter()
        .flat_map(|r| r.sites.iter().flat_map(|s| s.rules.clone()))
        .collect();
    rules.sort();
    rules.dedup();
    let mut disabled = Options::default();
    disabled.optimize.fusion.disabled_rules = rules;
    let (_, report) = smelt::compile(&model, &disabled).expect("compiles");
    assert!(report.fusion_reports.iter().all(|r| r.sites.is_empty()));

    // a pipeline without fusion, and the per-pass times of the one that ran
    let mut dce_only = Options::default();
    dce_only.optimize.passes = Some(vec!["dce".into()]);
    let (exe, report) = smelt::compile(&model, &dce_only).expect("compiles");
    assert!(report.fusion_reports.is_empty());
    assert_eq!(exe.kernel_counts(), unfused.kernel_counts());
    assert_eq!(report.pass_ms.len(), 1);
    assert_eq!(report.pass_ms[0].0, "dce");
    exe.run(&zeros(&exe)).expect("runs");
}

#[test]
fn compile_options_reach_the_back_end() {
    let model = tail();
    let cranelift = Options {
        compile: CompileOptions {
            kernels: Kernels::Cranelift,
            threads: 3,
            ..CompileOptions::default()
        },
        ..Options::default()
    };
    let (exe, _) = smelt::compile(&model, &cranelift).expect("compiles");
    assert_eq!(
        exe.tile_isa(),
        None,
        "kernels = cranelift calls no micro-kernel"
    );
    exe.run(&zeros(&exe)).expect("runs");

    let mut too_many = Options::default();
    too_many.compile.threads = smelt::MAX_THREADS + 1;
    match smelt::compile(&model, &too_many) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("threads"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
}

#[test]
fn pinned_shapes_are_used_by_compile_file_and_never_silently_dropped() {
    let model = tail();
    let mut shaped = Options::default();
    shaped
        .load
        .input_shapes
        .insert("x".into(), vec![1, 8, 6, 6]);
    // a module is already loaded: pinning its shapes now is refused, not ignored
    match smelt::compile(&model, &shaped) {
        Err(Error::InvalidArgument(msg)) => assert!(msg.contains("compile_file"), "{msg}"),
        other => panic!("expected InvalidArgument, got {other:?}"),
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tail.tir");
    text::write_module(&model, &path, &PrintOptions::default()).unwrap();
    let (exe, _) = smelt::compile_file(&path, &Options::default()).expect("compiles the file");
    assert_eq!(exe.inputs().len(), 2);
    // a .tir model's pinned shapes bind its symbolic sizes; a pin of a known size must
    // match it: load_model's error, through the driver
    let x = &model.funcs[0].params[0];
    let mut wrong = x.ty.dims.clone();
    wrong[3] += 1;
    let mut mismatched = Options::default();
    mismatched.load.input_shapes.insert(x.name.clone(), wrong);
    match smelt::compile_file(&path, &mismatched) {
        Err(Error::Ir(d)) => {
            let msg = d.to_string();
            assert!(
                msg.contains(&format!("input %{} dimension 3", x.name)),
                "{msg}"
            );
        }
        other => panic!("expected the pin's mismatch, got {:?}", other.map(|_| ())),
    }
}
