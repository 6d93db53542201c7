//! Fusion cases: every `tests/cases/fusion/*.tir` runs through fusion, const_fold and dce;
//! the report and the resulting IR are snapshot-tested, the result is checked against
//! the interpreter on the unfused input, and each case's `// expect-...:` lines are
//! checked. Positive cases are named after the rule they show (`RULE.tir`,
//! `RULE.variant.tir`); negative cases `expect_no_RULE_when_REASON.tir`.
//!
//! Directives (comment lines of the case file):
//! - `// expect-fired: r1, r2` — each rule built an op of the fused output;
//! - `// expect-ops-after: name=count, ...` — op counts after the whole pipeline;
//! - `// expect-near-miss: rule guard` — the rule matched and that guard refused;
//! - `// expect-lost: rule` — the rule fired but the cost model chose another graph.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use smelt_ir::text::{parse_with, print, PrintOptions};
use smelt_ir::weights::random_f32;
use smelt_ir::{interp, ErrorStats, Module, Tensor};
use smelt_passes::fusion::{builtin_rules, FusionOptions, FusionReport};
use smelt_passes::{PassContext, PassManager};

/// Relative error (FACTS.md) allowed between the fused and the unfused module.
const TOLERANCE: f64 = 1e-5;

fn load(path: &Path) -> (String, Module) {
    let src = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let name = path
        .file_name()
        .expect("case has a file name")
        .to_string_lossy()
        .into_owned();
    let module = parse_with(&src, &name, path.parent())
        .unwrap_or_else(|d| panic!("{} does not parse:\n{}", name, d.render(Some(&src))));
    (src, module)
}

/// Runs the default pipeline; returns the module and the context.
fn optimize(module: &Module) -> (Module, PassContext) {
    let mut out = module.clone();
    let mut cx = PassContext::default();
    PassManager::default_pipeline(&FusionOptions::default())
        .run(&mut out, &mut cx)
        .unwrap_or_else(|e| panic!("pipeline failed: {e}"));
    (out, cx)
}

fn random_inputs(module: &Module, seed: u64) -> Vec<Tensor> {
    let func = module.entry().expect("case has an entry function");
    func.params
        .iter()
        .enumerate()
        .map(|(i, p)| Tensor {
            ty: p.ty.clone(),
            data: random_f32(seed + i as u64, p.ty.storage_len(), -1.0, 1.0),
        })
        .collect()
}

/// The fused module computes what the input computes, within [`TOLERANCE`].
fn check_numerics(name: &str, before: &Module, after: &Module) {
    for seed in [7, 1234] {
        let inputs = random_inputs(before, seed);
        let want = interp::run(before, before.entry().expect("entry"), &inputs)
            .unwrap_or_else(|d| panic!("{name}: interpreter on the input: {d}"));
        let got = interp::run(after, after.entry().expect("entry"), &inputs)
            .unwrap_or_else(|d| panic!("{name}: interpreter on the fused module: {d}"));
        assert_eq!(want.len(), got.len(), "{name}: result count changed");
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            let stats = ErrorStats::between_tensors(g, w).expect("same shapes");
            assert!(
                stats.relative <= TOLERANCE,
                "{name}: result {i} differs: relative error {:e} (max abs {:e})",
                stats.relative,
                stats.max_abs
            );
        }
    }
}

fn directive<'a>(src: &'a str, key: &str) -> Vec<&'a str> {
    let prefix = format!("// {key}:");
    src.lines()
        .filter_map(|l| l.trim().strip_prefix(prefix.as_str()))
        .map(str::trim)
        .collect()
}

fn list(s: &str) -> impl Iterator<Item = &str> {
    s.split(',').map(str::trim).filter(|x| !x.is_empty())
}

fn fired(report: &FusionReport, rule: &str) -> bool {
    report
        .sites
        .iter()
        .any(|s| s.rules.iter().any(|r| r == rule))
}

fn check_expectations(name: &str, src: &str, cx: &PassContext, after: &Module) {
    let report = &cx.fusion_reports[0];
    let rule_names: Vec<String> = builtin_rules().into_iter().map(|r| r.name).collect();
    let mut want_fired: Vec<String> = directive(src, "expect-fired")
        .into_iter()
        .flat_map(list)
        .map(String::from)
        .collect();
    let stem = name.split('.').next().unwrap_or(name);
    if rule_names.iter().any(|r| r == stem) {
        want_fired.push(stem.to_string());
    }
    for rule in &want_fired {
        assert!(
            fired(report, rule),
            "{name}: rule {rule} did not build an op of the output\n{}",
            report.to_text()
        );
    }
    if let Some(rest) = stem.strip_prefix("expect_no_") {
        let rule = rest
            .split("_when_")
            .next()
            .expect("split yields at least one part");
        assert!(
            rule_names.iter().any(|r| r == rule),
            "{name}: names unknown rule {rule}"
        );
        assert!(
            !fired(report, rule),
            "{name}: rule {rule} fired\n{}",
            report.to_text()
        );
        let stats = report.rules.iter().find(|r| r.rule == rule).expect("stats");
        assert_eq!(stats.applied, 0, "{name}: rule {rule} was applied");
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for inst in &after.entry().expect("entry").insts {
        *counts.entry(inst.op.name()).or_default() += 1;
    }
    for line in directive(src, "expect-ops-after") {
        for item in list(line) {
            let (op, n) = item
                .split_once('=')
                .unwrap_or_else(|| panic!("{name}: bad expect-ops-after item '{item}'"));
            let n: usize = n.trim().parse().expect("count is a number");
            assert_eq!(
                counts.get(op.trim()).copied().unwrap_or(0),
                n,
                "{name}: count of '{}' after the pipeline (all: {counts:?})",
                op.trim()
            );
        }
    }
    for line in directive(src, "expect-near-miss") {
        let mut words = line.split_whitespace();
        let (rule, guard) = (words.next().expect("rule"), words.next().expect("guard"));
        assert!(
            report
                .near_misses
                .iter()
                .any(|n| n.rule == rule && n.guard == guard),
            "{name}: no near miss of {rule} by guard {guard}\n{}",
            report.to_text()
        );
    }
    for rule in directive(src, "expect-lost") {
        let lost = report.lost.iter().find(|l| l.rule == rule);
        let lost = lost.unwrap_or_else(|| {
            panic!(
                "{name}: {rule} did not lose in extraction\n{}",
                report.to_text()
            )
        });
        assert!(
            lost.fused_cost > lost.chosen_cost,
            "{name}: a lost fusion must cost more"
        );
    }
}

fn snapshot_text(cx: &PassContext, after: &Module) -> String {
    let mut text = String::new();
    for r in &cx.fusion_reports {
        text.push_str(&r.to_text());
    }
    for w in &cx.warnings {
        text.push_str(&format!("{w}\n"));
    }
    text.push_str("--- after fusion, const_fold, dce ---\n");
    text.push_str(&print(
        after,
        &PrintOptions {
            print_loc: true,
            elide_weights: true,
        },
    ));
    text
}

#[test]
fn fusion_cases() {
    for path in common::case_files("fusion") {
        let name = common::case_name(&path);
        let (src, module) = load(&path);
        let (after, cx) = optimize(&module);
        check_expectations(&name, &src, &cx, &after);
        check_numerics(&name, &module, &after);
        let text = snapshot_text(&cx, &after);
        common::snapshot_settings("fusion").bind(|| insta::assert_snapshot!(name, text));
    }
}

#[test]
fn every_builtin_rule_has_a_positive_and_a_negative_case() {
    let stems: Vec<String> = common::case_files("fusion")
        .iter()
        .map(|p| common::case_name(p))
        .collect();
    for rule in builtin_rules() {
        let positive = stems
            .iter()
            .any(|s| s.split('.').next() == Some(rule.name.as_str()));
        let negative = stems
            .iter()
            .any(|s| s.starts_with(&format!("expect_no_{}_when_", rule.name)));
        assert!(positive, "rule {} has no positive case", rule.name);
        assert!(negative, "rule {} has no negative case", rule.name);
    }
}

#[test]
fn every_fusion_snapshot_has_its_case() {
    let stems: Vec<String> = common::case_files("fusion")
        .iter()
        .map(|p| common::case_name(p))
        .collect();
    let dir = common::root().join("snapshots").join("fusion");
    for entry in std::fs::read_dir(&dir).expect("snapshots/fusion exists") {
        let path = entry.expect("dir entry").path();
        let file = path
            .file_name()
            .expect("name")
            .to_string_lossy()
            .into_owned();
        if let Some(stem) = file.strip_suffix(".snap") {
            assert!(
                stems.iter().any(|s| s == stem),
                "snapshot {file} has no case file"
            );
        }
    }
}

#[test]
fn fusing_twice_prints_identical_text() {
    for path in common::case_files("fusion") {
        let (_, module) = load(&path);
        let (a, ca) = optimize(&module);
        let (b, cb) = optimize(&module);
        assert_eq!(snapshot_text(&ca, &a), snapshot_text(&cb, &b));
    }
}

#[test]
fn thin_path_tail_is_one_fused_conv_with_add_and_relu() {
    let path = common::root().join("tests/cases/fusion/conv_bn_add_relu_tail.tir");
    let (_, module) = load(&path);
    let (after, _) = optimize(&module);
    let func = after.entry().expect("entry");
    let computing: Vec<_> = func
        .insts
        .iter()
        .filter(|i| !matches!(i.op, smelt_ir::Op::Const(_)))
        .collect();
    assert_eq!(computing.len(), 1, "one computing op remains");
    let smelt_ir::Op::Fused(f) = &computing[0].op else {
        panic!("not fused: {:?}", computing[0].op)
    };
    assert_eq!(f.anchor.name(), "conv2d");
    let posts: Vec<String> = f
        .post_ops
        .iter()
        .map(|p| match p {
            smelt_ir::PostOp::Unary(u) => u.name().to_string(),
            smelt_ir::PostOp::Binary { op, acc_is_lhs } => format!("{}:{acc_is_lhs}", op.name()),
        })
        .collect();
    assert_eq!(posts, ["add:true", "relu"]);
    // conv, bn, add and relu are all named in the fused op's location
    match &computing[0].loc {
        smelt_ir::Location::Fused(parts) => assert_eq!(parts.len(), 4, "{parts:?}"),
        other => panic!("fused op has location {other}"),
    }
    // the five input weights were replaced by the two folded ones
    assert_eq!(after.weights.len(), 2);
}
