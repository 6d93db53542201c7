//! `smelt::verify`: the three-way comparison passes on sound fusion (every fusion case,
//! ResNet-18), catches a planted unsound rule — per layer at the right node, by bisection
//! at the right rule — and rule switches remove exactly the fusions they name.

mod common;

use std::path::Path;

use smelt::ir::text::{parse_with, print, PrintOptions};
use smelt::ir::{Location, Module, Tensor};
use smelt::models::{resnet, ResNetConfig};
use smelt::passes::fusion::{load_rules, FusionOptions};
use smelt::verify::{verify, BisectOutcome, Run, VerifyOptions, VerifyReport};
use smelt::OptimizeOptions;

/// Parses a case file, naming it by its file name only (locations stay short and stable).
fn load_case(path: &Path) -> (String, Module) {
    let src = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let name = path
        .file_name()
        .expect("case has a file name")
        .to_string_lossy()
        .into_owned();
    let module = parse_with(&src, &name, path.parent())
        .unwrap_or_else(|d| panic!("{name} does not parse:\n{}", d.render(Some(&src))));
    (src, module)
}

fn verify_case(dir: &str) -> std::path::PathBuf {
    common::root().join("tests").join("cases").join(dir)
}

/// The planted unsound rule of tests/cases/verify/bn_through_relu.rules.
const PLANTED: &str = "fold-bn-through-relu";

fn planted_options() -> OptimizeOptions {
    rule_file_options("bn_through_relu.rules", PLANTED)
}

/// The planted rule of tests/cases/verify/shift_into_padded_conv.rules: the built-in
/// shift fold without its `unpadded` guard (the BN-before-a-padded-conv fold).
const PLANTED_PADDED: &str = "fold-shift-into-padded-conv";

/// Optimization options with the one rule of `file` (in tests/cases/verify) added.
fn rule_file_options(file: &str, rule: &str) -> OptimizeOptions {
    let path = verify_case("verify").join(file);
    let src = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let rules = load_rules(&src, file).unwrap_or_else(|d| panic!("{file} does not load:\n{d}"));
    assert_eq!(rules.len(), 1, "{file} holds one rule");
    assert_eq!(rules[0].name, rule);
    OptimizeOptions {
        fusion: FusionOptions {
            extra_rules: rules,
            // the planted rules are wrong on purpose: verify is what catches them here
            allow_unchecked_rules: true,
            ..FusionOptions::default()
        },
        ..OptimizeOptions::default()
    }
}

/// The location of the line of `src` that starts (after indentation) with `prefix`.
fn line_of(src: &str, file: &str, prefix: &str) -> Location {
    let (i, line) = src
        .lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("{file} has no line starting with {prefix:?}"));
    let col = line.len() - line.trim_start().len() + 1;
    Location::file(file, i as u32 + 1, col as u32)
}

fn assert_three_way_pass(name: &str, report: &VerifyReport) {
    assert!(
        report.passed(),
        "{name}: verify failed:\n{}",
        report.to_text()
    );
    for o in &report.outputs {
        let pairs: Vec<(Run, Run)> = o.comparisons.iter().map(|c| (c.got, c.reference)).collect();
        assert_eq!(
            pairs,
            [
                (Run::InterpFused, Run::InterpUnfused),
                (Run::JitFused, Run::InterpUnfused),
                (Run::JitFused, Run::InterpFused),
            ],
            "{name}: output {} is not compared three ways",
            o.name
        );
    }
}

#[test]
fn verify_passes_on_every_fusion_case_with_per_layer() {
    for path in common::case_files("fusion") {
        let name = common::case_name(&path);
        let (_, module) = load_case(&path);
        // a case with symbolic sizes is verified with every symbol at 5
        let module = common::at_every_symbol(&module, 5);
        let opts = VerifyOptions {
            per_layer: true,
            ..VerifyOptions::default()
        };
        let report = verify(&module, &opts).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_three_way_pass(&name, &report);
        let layers = report.per_layer.as_ref().expect("per-layer was asked for");
        assert!(
            layers.jit_note.is_none(),
            "{name}: JIT intermediates not compared: {:?}",
            layers.jit_note
        );
        // Every op of the fused function is compared (interpreter and JIT) or skipped
        // only because a rewrite split its user op; sites that survive const_fold are
        // compared.
        let mut fused = module.clone();
        smelt::optimize(&mut fused, &OptimizeOptions::default(), None).expect("optimizes");
        let func = fused.entry().expect("entry");
        let ops: Vec<usize> = (0..func.insts.len())
            .filter(|&i| !matches!(func.insts[i].op, smelt::ir::Op::Const(_)))
            .collect();
        let mut seen: Vec<usize> = layers
            .layers
            .iter()
            .map(|l| l.inst)
            .chain(layers.skipped.iter().map(|s| s.inst))
            .collect();
        seen.sort();
        assert_eq!(
            seen,
            ops,
            "{name}: not every op accounted for:\n{}",
            report.to_text()
        );
        for s in &layers.skipped {
            // a fused op that computes part of a chain, or an activation moved before a
            // reshape or transpose (its value is the unfused one in another shape)
            assert!(
                s.reason.contains("computes only part of")
                    || s.reason.contains("differs from the unfused value's"),
                "{name}: %{} skipped: {}\n{}",
                s.inst,
                s.reason,
                report.to_text()
            );
        }
        assert!(layers.layers.iter().all(|l| l.jit.is_some()), "{name}");
        for l in &layers.layers {
            let site = report.sites.iter().find(|s| {
                s.op == l.op && Location::fuse(s.merged.clone()) == func.insts[l.inst].loc
            });
            assert_eq!(
                l.rules,
                site.map(|s| s.rules.clone()).unwrap_or_default(),
                "{name}: %{} has the wrong rules",
                l.inst
            );
        }
    }
}

#[test]
fn verify_passes_on_resnet18() {
    let module = resnet(&ResNetConfig::resnet18()).expect("ResNet-18 builds");
    let opts = VerifyOptions {
        per_layer: true,
        ..VerifyOptions::default()
    };
    let report = verify(&module, &opts).expect("verify runs");
    assert_three_way_pass("resnet18", &report);
    let layers = report.per_layer.as_ref().expect("per-layer was asked for");
    assert!(
        layers.skipped.is_empty() && layers.layers.iter().all(|l| l.jit.is_some()),
        "every ResNet-18 layer is compared, by the interpreter and the JIT:\n{}",
        report.to_text()
    );
    // Fusion did happen: one conv site per conv of the network at least.
    let convs = module.funcs[0]
        .insts
        .iter()
        .filter(|i| matches!(i.op, smelt::ir::Op::Conv2d(_)))
        .count();
    assert!(
        report.sites.len() >= convs,
        "ResNet-18 has {convs} convs but only {} fusion sites",
        report.sites.len()
    );
}

#[test]
fn the_case_passes_without_the_planted_rule() {
    let (_, module) = load_case(&verify_case("verify").join("bn_after_relu.tir"));
    let opts = VerifyOptions {
        per_layer: true,
        bisect: true,
        ..VerifyOptions::default()
    };
    let report = verify(&module, &opts).expect("verify runs");
    assert_three_way_pass("bn_after_relu", &report);
    let bisect = report.bisect.expect("bisect was asked for");
    assert_eq!(bisect.outcome, BisectOutcome::NotNeeded);
    assert!(
        bisect.probes.is_empty(),
        "nothing to bisect, nothing probed"
    );
}

#[test]
fn verify_catches_the_planted_rule_per_layer_and_by_bisection() {
    let path = verify_case("verify").join("bn_after_relu.tir");
    let (src, module) = load_case(&path);
    let file = "bn_after_relu.tir";
    let opts = VerifyOptions {
        optimize: planted_options(),
        per_layer: true,
        bisect: true,
        ..VerifyOptions::default()
    };
    let report = verify(&module, &opts).expect("verify runs");
    let text = report.to_text();
    assert!(!report.passed(), "the unsound rule went unnoticed:\n{text}");
    for (got, reference) in [
        (Run::InterpFused, Run::InterpUnfused),
        (Run::JitFused, Run::InterpUnfused),
    ] {
        let worst = report.worst(got, reference).expect("compared");
        assert!(
            worst > opts.rtol,
            "{} vs {}: relative {worst:e} passes:\n{text}",
            got.label(),
            reference.label()
        );
    }
    // The JIT computes what the fused graph says: that pair agrees.
    let jit_vs_fused = report
        .worst(Run::JitFused, Run::InterpFused)
        .expect("compared");
    assert!(jit_vs_fused <= opts.rtol, "{text}");

    // Per layer: the first divergent value is the fused conv standing for conv, relu and
    // the batch norm after it — the last of which is the value compared.
    let per_layer = report.per_layer.as_ref().expect("per-layer was asked for");
    let first = per_layer
        .first_divergence
        .and_then(|k| per_layer.layers.get(k))
        .unwrap_or_else(|| panic!("no divergence found:\n{text}"));
    let conv = line_of(&src, file, "%c1 = conv2d");
    let relu = line_of(&src, file, "%r1 = relu");
    let bn = line_of(&src, file, "%n1 = batch_norm");
    let names: Vec<(&str, &Location)> = first
        .user_ops
        .iter()
        .map(|u| (u.op.as_str(), &u.location))
        .collect();
    assert_eq!(
        names,
        [("conv2d", &conv), ("relu", &relu), ("batch_norm", &bn)],
        "{text}"
    );
    assert!(first.rules.iter().any(|r| r == PLANTED), "{text}");
    assert_eq!(
        module.funcs[0].insts[first.reference_inst].loc, bn,
        "compared against the wrong unfused value:\n{text}"
    );
    // Everything before it agrees.
    let k = per_layer.first_divergence.expect("checked above");
    assert!(per_layer.layers[..k].iter().all(|l| l.pass));

    // Bisection names the planted rule's site.
    let bisect = report.bisect.as_ref().expect("bisect was asked for");
    assert_eq!(bisect.oracle, Run::InterpFused);
    match &bisect.outcome {
        BisectOutcome::Culprit { site, user_ops, .. } => {
            assert!(site.rules.iter().any(|r| r == PLANTED), "{text}");
            assert_eq!(user_ops.last().map(|u| &u.location), Some(&bn), "{text}");
        }
        other => panic!("bisection found no culprit: {other:?}\n{text}"),
    }
    // The probes bracket the culprit: its predecessors agree, it disagrees.
    let BisectOutcome::Culprit { sites, .. } = bisect.outcome else {
        unreachable!("matched above")
    };
    assert!(bisect
        .probes
        .iter()
        .any(|p| p.sites == sites - 1 && p.agree));
    assert!(bisect.probes.iter().all(|p| p.agree == (p.sites < sites)));
    assert!(text.contains(PLANTED), "{text}");
}

#[test]
fn verify_catches_a_shift_folded_into_a_padded_conv() {
    let path = verify_case("verify").join("bn_after_relu.tir");
    let (src, module) = load_case(&path);
    let file = "bn_after_relu.tir";
    let opts = VerifyOptions {
        optimize: rule_file_options("shift_into_padded_conv.rules", PLANTED_PADDED),
        per_layer: true,
        bisect: true,
        ..VerifyOptions::default()
    };
    let report = verify(&module, &opts).expect("verify runs");
    let text = report.to_text();
    assert!(!report.passed(), "the unsound rule went unnoticed:\n{text}");
    assert!(
        report
            .sites
            .iter()
            .any(|s| s.rules.iter().any(|r| r == PLANTED_PADDED)),
        "the planted rule built no site:\n{text}"
    );
    // Per layer: the first divergent value is the one the padded conv's fold built; it
    // merges the conv whose padding the rule ignored.
    let per_layer = report.per_layer.as_ref().expect("per-layer was asked for");
    let first = per_layer
        .first_divergence
        .and_then(|k| per_layer.layers.get(k))
        .unwrap_or_else(|| panic!("no divergence found:\n{text}"));
    let padded_conv = line_of(&src, file, "%c2 = conv2d");
    assert!(
        first
            .user_ops
            .iter()
            .any(|u| u.op == "conv2d" && u.location == padded_conv),
        "{text}"
    );
    assert!(first.rules.iter().any(|r| r == PLANTED_PADDED), "{text}");
    // Bisection names the planted rule.
    match &report
        .bisect
        .as_ref()
        .expect("bisect was asked for")
        .outcome
    {
        BisectOutcome::Culprit { site, .. } => {
            assert!(site.rules.iter().any(|r| r == PLANTED_PADDED), "{text}")
        }
        other => panic!("bisection found no culprit: {other:?}\n{text}"),
    }
}

#[test]
fn disabling_the_planted_rule_makes_verify_pass_again() {
    let (_, module) = load_case(&verify_case("verify").join("bn_after_relu.tir"));
    let mut optimize = planted_options();
    optimize.fusion.disabled_rules = vec![PLANTED.to_string()];
    let opts = VerifyOptions {
        optimize,
        ..VerifyOptions::default()
    };
    let report = verify(&module, &opts).expect("verify runs");
    assert_three_way_pass("bn_after_relu without the planted rule", &report);
}

/// The sites of `module` fused under `fusion` as (op, rules, merged locations), and
/// the fused module's text.
fn fuse(module: &Module, fusion: FusionOptions) -> (Vec<(String, Vec<String>, Location)>, String) {
    let mut fused = module.clone();
    let cx = smelt::optimize(
        &mut fused,
        &OptimizeOptions {
            fusion,
            ..OptimizeOptions::default()
        },
        None,
    )
    .expect("optimizes");
    let sites = cx
        .fusion_reports
        .iter()
        .flat_map(|r| &r.sites)
        .map(|s| {
            (
                s.op.clone(),
                s.rules.clone(),
                Location::fuse(s.merged.clone()),
            )
        })
        .collect();
    let text = print(
        &fused,
        &PrintOptions {
            print_loc: true,
            elide_weights: true,
        },
    );
    (sites, text)
}

fn verify_with(module: &Module, fusion: FusionOptions) -> VerifyReport {
    verify(
        module,
        &VerifyOptions {
            optimize: OptimizeOptions {
                fusion,
                ..OptimizeOptions::default()
            },
            ..VerifyOptions::default()
        },
    )
    .expect("verify runs")
}

#[test]
fn disable_rules_removes_exactly_the_named_fusions() {
    let (_, module) = load_case(&verify_case("verify").join("independent_sites.tir"));
    let (full, full_text) = fuse(&module, FusionOptions::default());
    let mut rules: Vec<&str> = full
        .iter()
        .flat_map(|(_, r, _)| r.iter().map(String::as_str))
        .collect();
    rules.sort();
    assert_eq!(
        rules,
        ["absorb-activation", "absorb-relu", "fold-bn-into-conv"],
        "each site has its own rule:\n{full_text}"
    );
    let mut snapshot = String::new();
    for disabled in rules {
        let fusion = FusionOptions {
            disabled_rules: vec![disabled.to_string()],
            ..FusionOptions::default()
        };
        let (sites, text) = fuse(&module, fusion.clone());
        let expected: Vec<_> = full
            .iter()
            .filter(|(_, r, _)| !r.iter().any(|r| r == disabled))
            .cloned()
            .collect();
        assert_eq!(sites, expected, "without {disabled}:\n{text}");
        snapshot.push_str(&format!("// --disable-rules {disabled}\n{text}\n"));
        assert_three_way_pass(
            &format!("independent_sites without {disabled}"),
            &verify_with(&module, fusion),
        );
    }
    // One snapshot per case file (tests/snapshot_inputs.rs pairs them by name).
    common::snapshot_settings("verify")
        .bind(|| insta::assert_snapshot!("independent_sites", snapshot));
}

#[test]
fn disabling_a_rule_also_removes_fusions_built_on_it() {
    let path = common::root()
        .join("tests")
        .join("cases")
        .join("fusion")
        .join("conv_bn_add_relu_tail.tir");
    let (_, module) = load_case(&path);
    let (full, full_text) = fuse(&module, FusionOptions::default());
    assert_eq!(full.len(), 1, "one site:\n{full_text}");
    // Without the BN fold the add has no anchor to join, and the relu none either.
    for (disabled, remaining) in [
        ("absorb-relu", vec!["fold-bn-into-conv", "absorb-add"]),
        ("absorb-add", vec!["fold-bn-into-conv"]),
        ("fold-bn-into-conv", vec![]),
    ] {
        let fusion = FusionOptions {
            disabled_rules: vec![disabled.to_string()],
            ..FusionOptions::default()
        };
        let (sites, text) = fuse(&module, fusion.clone());
        let rules: Vec<&str> = sites
            .iter()
            .flat_map(|(_, r, _)| r.iter().map(String::as_str))
            .collect();
        assert_eq!(rules, remaining, "without {disabled}:\n{text}");
        assert_three_way_pass(
            &format!("tail without {disabled}"),
            &verify_with(&module, fusion),
        );
    }
}

#[test]
fn verify_rejects_unknown_and_misshapen_inputs() {
    let (_, module) = load_case(&verify_case("verify").join("bn_after_relu.tir"));
    let wrong_name = VerifyOptions {
        inputs: vec![(
            "nope".to_string(),
            Tensor::new([1, 8, 12, 12], vec![0.0; 8 * 144]).expect("tensor"),
        )],
        ..VerifyOptions::default()
    };
    let e = verify(&module, &wrong_name).expect_err("unknown input accepted");
    assert!(e.to_string().contains("%nope"), "{e}");
    let wrong_shape = VerifyOptions {
        inputs: vec![(
            "x".to_string(),
            Tensor::new([1, 8, 12], vec![0.0; 8 * 12]).expect("tensor"),
        )],
        ..VerifyOptions::default()
    };
    let e = verify(&module, &wrong_shape).expect_err("misshapen input accepted");
    assert!(e.to_string().contains("%x"), "{e}");
}

#[test]
fn given_inputs_are_used_and_reports_are_deterministic() {
    let (_, module) = load_case(&verify_case("verify").join("bn_after_relu.tir"));
    let opts = VerifyOptions {
        optimize: planted_options(),
        per_layer: true,
        ..VerifyOptions::default()
    };
    let a = verify(&module, &opts).expect("verify runs");
    let b = verify(&module, &opts).expect("verify runs");
    assert_eq!(a.to_text(), b.to_text());
    assert_eq!(a.to_json(), b.to_json());
    // All-zero input: the planted rule is still wrong (relu(delta) != delta for delta < 0)
    // but the errors differ from the random input's.
    let zeros = VerifyOptions {
        inputs: vec![(
            "x".to_string(),
            Tensor::new([1, 8, 12, 12], vec![0.0; 8 * 144]).expect("tensor"),
        )],
        ..opts.clone()
    };
    let z = verify(&module, &zeros).expect("verify runs");
    assert!(z
        .to_text()
        .contains("input %x: tensor<1x8x12x12xf32> (given)"));
    assert_ne!(
        z.worst(Run::InterpFused, Run::InterpUnfused),
        a.worst(Run::InterpFused, Run::InterpUnfused)
    );
}
