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
//! - `// expect-lost: rule` — the rule fired but the cost model chose another graph;
//! - `// disable-rules: r1, r2` — run without these rules (e.g. to keep an op unfused so
//!   the refusal of the rule under test shows as a near miss).

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
    optimize_with(module, &FusionOptions::default())
}

/// The fusion options a case asks for with `// disable-rules: a, b`.
fn case_options(src: &str) -> FusionOptions {
    FusionOptions {
        disabled_rules: directive(src, "disable-rules")
            .into_iter()
            .flat_map(list)
            .map(String::from)
            .collect(),
        ..FusionOptions::default()
    }
}

/// Runs the default pipeline with `options`; returns the module and the context.
fn optimize_with(module: &Module, options: &FusionOptions) -> (Module, PassContext) {
    let mut out = module.clone();
    let mut cx = PassContext::default();
    PassManager::default_pipeline(options)
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
            data: random_f32(seed + i as u64, p.ty.storage_len(), -1.0, 1.0).into(),
        })
        .collect()
}

/// The fused module computes what the input computes, within [`TOLERANCE`].
fn check_numerics(name: &str, before: &Module, after: &Module) {
    if before.entry().is_some_and(|f| f.is_symbolic()) {
        // fused once for every size: both specialized at a few sizes, then compared
        for size in [1, 5, 12] {
            let (b, a) = (
                common::at_every_symbol(before, size),
                common::at_every_symbol(after, size),
            );
            check_numerics(&format!("{name} at {size}"), &b, &a);
        }
        return;
    }
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
        let (after, cx) = optimize_with(&module, &case_options(&src));
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
        let (src, module) = load(&path);
        let options = case_options(&src);
        let (a, ca) = optimize_with(&module, &options);
        let (b, cb) = optimize_with(&module, &options);
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

const DOUBLE_RELU: &str = "\
func @f(%x: tensor<2x3xf32>) -> tensor<2x3xf32> {
  %a = relu %x : tensor<2x3xf32>
  %b = relu %a : tensor<2x3xf32>
  return %b : tensor<2x3xf32>
}
";

#[test]
fn a_user_rule_loaded_at_run_time_changes_the_ir() {
    let module = parse_with(DOUBLE_RELU, "double.tir", None).expect("parses");
    let rules = smelt_passes::fusion::load_rules(
        "family user\n\
         rule drop-double-relu\n  \
           law relu(relu(x)) = relu(x)\n  \
           lhs (relu (relu ?x))\n  \
           rhs (relu ?x)\n",
        "user.rules",
    )
    .expect("user rule loads");
    let run = |extra: Vec<smelt_passes::fusion::Rule>| {
        let mut m = module.clone();
        let mut cx = PassContext::default();
        let opts = FusionOptions {
            extra_rules: extra,
            ..FusionOptions::default()
        };
        PassManager::default_pipeline(&opts)
            .run(&mut m, &mut cx)
            .expect("pipeline runs");
        (m, cx)
    };
    let (plain, _) = run(Vec::new());
    assert_eq!(plain.funcs[0].insts.len(), 2);
    let (with_rule, cx) = run(rules);
    assert_eq!(with_rule.funcs[0].insts.len(), 1);
    let stats = cx.fusion_reports[0]
        .rules
        .iter()
        .find(|r| r.rule == "drop-double-relu")
        .expect("user rule is reported");
    assert_eq!(stats.applied, 1);
    check_numerics("double relu", &module, &with_rule);
}

#[test]
fn a_malformed_user_rule_file_is_an_error_with_line_and_column() {
    let err = smelt_passes::fusion::load_rules("rule r\n  lhs (relu ?x\n", "bad.rules")
        .expect_err("unclosed paren");
    let text = err.to_string();
    assert!(text.contains("bad.rules:2:7"), "{text}");
}

#[test]
fn json_report_counts_ops_before_and_after() {
    let path = common::root().join("tests/cases/fusion/conv_bn_add_relu_tail.tir");
    let (_, module) = load(&path);
    let (_, cx) = optimize(&module);
    let json = cx.fusion_reports[0].to_json();
    let v: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{json}"));
    assert_eq!(v["func"], "tail", "{json}");
    assert_eq!(
        v["ops_before"],
        serde_json::json!({"add": 1, "batch_norm": 1, "const": 5, "conv2d": 1, "relu": 1}),
        "{json}"
    );
    assert!(v["ops_after"].is_object(), "{json}");
    assert!(!json.contains("NaN"), "{json}");
}

#[test]
fn disabled_fusion_leaves_the_function_alone() {
    let path = common::root().join("tests/cases/fusion/conv_bn_add_relu_tail.tir");
    let (_, module) = load(&path);
    let mut m = module.clone();
    let mut cx = PassContext::default();
    let opts = FusionOptions {
        enabled: false,
        ..FusionOptions::default()
    };
    PassManager::from_names(&["fusion"], &opts)
        .expect("known pass")
        .run(&mut m, &mut cx)
        .expect("runs");
    assert_eq!(m.funcs, module.funcs);
}

#[test]
fn pipeline_names_are_checked_and_dumps_follow_each_pass() {
    assert!(PassManager::from_names(&["fusion", "nope"], &FusionOptions::default()).is_err());
    let path = common::root().join("tests/cases/fusion/absorb-relu.tir");
    let (_, module) = load(&path);
    let mut m = module.clone();
    let mut dumps: Vec<(String, usize)> = Vec::new();
    {
        let mut pm = PassManager::default_pipeline(&FusionOptions::default());
        pm.set_dump(|pass, module| dumps.push((pass.to_string(), module.funcs[0].insts.len())));
        pm.run(&mut m, &mut PassContext::default()).expect("runs");
    }
    let passes: Vec<&str> = dumps.iter().map(|(p, _)| p.as_str()).collect();
    assert_eq!(passes, ["fusion", "const_fold", "dce"]);
    // fusion leaves the old conv's weights for dce; dce removes nothing live
    assert_eq!(dumps[2].1, 3);
}

/// Computing ops (everything but `const`) of the entry function, by mnemonic.
fn computing_ops(module: &Module) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for inst in &module.entry().expect("entry").insts {
        if !matches!(inst.op, smelt_ir::Op::Const(_)) {
            *counts.entry(inst.op.name().to_string()).or_default() += 1;
        }
    }
    counts
}

/// `site_limit = N` keeps exactly the first N sites of the full fusion: 0 gives the
/// unfused graph, the total gives the full fusion, and every graph in between keeps the
/// sites of the smaller limits, computes the same thing, and has no more ops than them.
#[test]
fn site_limit_keeps_the_first_sites_and_leaves_the_rest_unfused() {
    let module = smelt::models::resnet(&smelt::models::ResNetConfig::demo()).expect("demo net");
    let run = |limit: Option<usize>| {
        let mut m = module.clone();
        let mut cx = PassContext::default();
        let opts = FusionOptions {
            site_limit: limit,
            ..FusionOptions::default()
        };
        PassManager::default_pipeline(&opts)
            .run(&mut m, &mut cx)
            .unwrap_or_else(|e| panic!("pipeline with site limit {limit:?}: {e}"));
        (m, cx)
    };
    let (full, full_cx) = run(None);
    let full_sites = &full_cx.fusion_reports[0].sites;
    let total = full_sites.len();
    assert!(total >= 4, "the demo net has several sites, got {total}");
    let print_opts = PrintOptions {
        print_loc: true,
        elide_weights: true,
    };
    let mut previous: Option<usize> = None;
    for n in 0..=total {
        let (limited, cx) = run(Some(n));
        let report = &cx.fusion_reports[0];
        let kept: std::collections::BTreeSet<_> =
            report.sites.iter().map(|s| s.merged.clone()).collect();
        let want: std::collections::BTreeSet<_> =
            full_sites[..n].iter().map(|s| s.merged.clone()).collect();
        assert_eq!(kept, want, "limit {n}: the kept sites are the first {n}");
        assert_eq!(
            report.withheld,
            full_sites[n..],
            "limit {n}: withheld sites"
        );
        let ops: usize = computing_ops(&limited).values().sum();
        if let Some(p) = previous {
            assert!(ops < p, "limit {n}: {ops} ops, limit {} had {p}", n - 1);
        }
        previous = Some(ops);
        check_numerics(&format!("site limit {n}"), &module, &limited);
        if n == 0 {
            assert_eq!(computing_ops(&limited), computing_ops(&module));
        }
        if n == total {
            assert_eq!(print(&limited, &print_opts), print(&full, &print_opts));
        }
    }
    // A limit past the end is the full fusion.
    let (past, _) = run(Some(total + 3));
    assert_eq!(print(&past, &print_opts), print(&full, &print_opts));
}

/// Hard-swish written out after a conv, `y * clip(y + 3, 0, 6) / 6`, with the rules that
/// recognize it switched off: absorbing each elementwise op into the conv would give two fused convs
/// on the same operands (one ending in the clip, one in the division), which the roofline
/// prices below one conv and four elementwise kernels. Extraction never repeats an anchor
/// computation, so the conv runs once, whatever the sizes.
#[test]
fn unfused_hard_swish_after_a_conv_computes_the_conv_once() {
    for (c, hw) in [(4, 8), (16, 16), (64, 28)] {
        let o = c * 2;
        let src = format!(
            "const @w : tensor<{o}x{c}x3x3xf32> = random<seed = 1, min = -0.2, max = 0.2>\n\
             const @three : tensor<f32> = dense<3.0>\n\
             const @six : tensor<f32> = dense<6.0>\n\
             func @main(%x: tensor<1x{c}x{hw}x{hw}xf32>) -> tensor<1x{o}x{hw}x{hw}xf32> {{\n  \
             %w = const @w : tensor<{o}x{c}x3x3xf32>\n  \
             %y = conv2d %x, %w {{pads = [1, 1, 1, 1]}} : tensor<1x{o}x{hw}x{hw}xf32>\n  \
             %t = const @three : tensor<f32>\n  \
             %a = add %y, %t : tensor<1x{o}x{hw}x{hw}xf32>\n  \
             %k = clip %a {{min = 0.0, max = 6.0}} : tensor<1x{o}x{hw}x{hw}xf32>\n  \
             %m = mul %y, %k : tensor<1x{o}x{hw}x{hw}xf32>\n  \
             %s = const @six : tensor<f32>\n  \
             %r = div %m, %s : tensor<1x{o}x{hw}x{hw}xf32>\n  \
             return %r : tensor<1x{o}x{hw}x{hw}xf32>\n}}\n"
        );
        let module = smelt_ir::text::parse(&src, "hard_swish.tir").expect("parses");
        // the case is about a hard-swish no rule recognizes: without the built-in ones
        let recognizing: Vec<String> = builtin_rules()
            .iter()
            .filter(|r| r.name.contains("hard-swish"))
            .map(|r| r.name.clone())
            .collect();
        assert!(
            !recognizing.is_empty(),
            "the built-in hard-swish rules are found"
        );
        let options = FusionOptions {
            disabled_rules: recognizing,
            ..FusionOptions::default()
        };
        let (after, _) = optimize_with(&module, &options);
        let convs = after
            .entry()
            .expect("entry")
            .insts
            .iter()
            .filter(|i| match &i.op {
                smelt_ir::Op::Fused(f) => matches!(*f.anchor, smelt_ir::Op::Conv2d(_)),
                op => matches!(op, smelt_ir::Op::Conv2d(_)),
            })
            .count();
        assert_eq!(
            convs,
            1,
            "C{c} {hw}x{hw}: the conv is computed {convs} times:\n{}",
            print(&after, &PrintOptions::default())
        );
        check_numerics("hard_swish", &module, &after);
    }
}
