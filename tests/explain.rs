//! `smelt explain`: the explanation of fusion cases is snapshot-tested (a fused tail, a
//! guard refusal, a fusion that lost in extraction), byte-identical across runs, and the
//! CLI's `--json` is one valid JSON object whose op counts are those of the pipeline's
//! result.

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use smelt::models::{resnet, ResNetConfig};
use smelt_ir::text::parse_with;
use smelt_ir::Module;
use smelt_passes::fusion::{explain_json, explain_text, FusionOptions};
use smelt_passes::{PassContext, PassManager};

/// The fusion cases whose explanations are snapshots: a positive case, a negative case
/// where a guard refuses, and a case where fusion loses in extraction.
const CASES: &[&str] = &[
    "conv_bn_add_relu_tail",
    "expect_no_fold-bn-into-conv_when_bn_params_are_not_constant",
    "shared_conv_two_consumers",
];

fn load_case(name: &str) -> Module {
    let path = common::root()
        .join("tests/cases/fusion")
        .join(format!("{name}.tir"));
    let src = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    parse_with(&src, &format!("{name}.tir"), path.parent())
        .unwrap_or_else(|d| panic!("{name} does not parse:\n{}", d.render(Some(&src))))
}

fn pipeline(module: &Module) -> (Module, PassContext) {
    let mut out = module.clone();
    let mut cx = PassContext::default();
    PassManager::default_pipeline(&FusionOptions::default())
        .run(&mut out, &mut cx)
        .unwrap_or_else(|e| panic!("pipeline failed: {e}"));
    (out, cx)
}

/// Op counts of every function of `module`, by mnemonic, counted here independently of
/// the report.
fn counted_ops(module: &Module) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for f in &module.funcs {
        for inst in &f.insts {
            *counts.entry(inst.op.name().to_string()).or_default() += 1;
        }
    }
    counts
}

fn json_counts(v: &serde_json::Value, key: &str) -> BTreeMap<String, usize> {
    v[key]
        .as_object()
        .unwrap_or_else(|| panic!("'{key}' is an object: {v}"))
        .iter()
        .map(|(k, n)| (k.clone(), n.as_u64().expect("a count") as usize))
        .collect()
}

#[test]
fn explanations_of_fusion_cases() {
    for name in CASES {
        let module = load_case(name);
        let (after, cx) = pipeline(&module);
        let text = explain_text(&cx.fusion_reports);
        // The counts are those of the pipeline's result, not of fusion's own output.
        let after_line = format!("  ops after:  {}\n", {
            let c = counted_ops(&after);
            c.iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect::<Vec<_>>()
                .join(", ")
        });
        assert!(text.contains(&after_line), "{name}:\n{text}");
        common::snapshot_settings("explain").bind(|| insta::assert_snapshot!(*name, text));
    }
}

#[test]
fn explanation_names_the_refusing_guard_and_the_lost_costs() {
    let (_, cx) = pipeline(&load_case(CASES[1]));
    let text = explain_text(&cx.fusion_reports);
    assert!(
        text.contains("fold-bn-into-conv refused by guard 'const'") && text.contains("%g"),
        "{text}"
    );
    let (_, cx) = pipeline(&load_case(CASES[2]));
    let report = &cx.fusion_reports[0];
    assert!(!report.lost.is_empty());
    for l in &report.lost {
        assert!(l.fused_cost > l.chosen_cost, "{l:?}");
    }
}

#[test]
fn explaining_twice_gives_identical_text_and_json() {
    for name in CASES {
        let module = load_case(name);
        let (_, a) = pipeline(&module);
        let (_, b) = pipeline(&module);
        assert_eq!(
            explain_text(&a.fusion_reports),
            explain_text(&b.fusion_reports)
        );
        assert_eq!(
            explain_json(&a.fusion_reports),
            explain_json(&b.fusion_reports)
        );
    }
}

#[test]
fn every_explain_snapshot_has_its_case() {
    let dir = common::root().join("snapshots").join("explain");
    for entry in std::fs::read_dir(&dir).expect("snapshots/explain exists") {
        let file = entry.expect("dir entry").file_name();
        let file = file.to_string_lossy();
        if let Some(stem) = file.strip_suffix(".snap") {
            assert!(CASES.contains(&stem), "snapshot {file} has no case");
        }
    }
}

#[test]
fn cli_json_is_one_object_with_the_pipeline_op_counts() {
    let case = Path::new("tests/cases/fusion/conv_bn_add_relu_tail.tir");
    let out = common::smelt(&["explain", case.to_str().expect("utf-8 path"), "--json"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).expect("utf-8 output");
    let v: serde_json::Value =
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{stdout}"));
    let module = load_case("conv_bn_add_relu_tail");
    let (after, _) = pipeline(&module);
    assert_eq!(json_counts(&v, "ops_before"), counted_ops(&module));
    assert_eq!(json_counts(&v, "ops_after"), counted_ops(&after));
    let sites = v["sites"].as_array().expect("sites");
    assert_eq!(sites.len(), 1);
    let merged: Vec<&str> = sites[0]["merged"]
        .as_array()
        .expect("merged")
        .iter()
        .map(|m| m["op"].as_str().expect("op"))
        .collect();
    assert_eq!(merged, ["conv2d", "batch_norm", "add", "relu"]);
    assert!(v["near_misses"].is_array() && v["lost"].is_array());

    // The rule switches reach the pipeline: without fusion nothing is merged.
    let out = common::smelt(&[
        "explain",
        case.to_str().expect("utf-8 path"),
        "--json",
        "--no-fuse",
    ]);
    assert!(out.status.success());
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["sites"].as_array().map(Vec::len), Some(0));
    assert_eq!(json_counts(&v, "ops_after"), counted_ops(&module));
}

/// The acceptance: after the pipeline, ResNet-18 has no batch_norm, add or relu
/// op left, as `explain --json` reports it.
#[test]
fn resnet18_explanation_reports_no_bn_add_or_relu_after() {
    let module = resnet(&ResNetConfig::resnet18()).expect("network builds");
    let (after, cx) = pipeline(&module);
    let v: serde_json::Value =
        serde_json::from_str(&explain_json(&cx.fusion_reports)).expect("valid JSON");
    let ops_after = json_counts(&v, "ops_after");
    assert_eq!(ops_after, counted_ops(&after));
    for op in [
        "batch_norm",
        "add",
        "relu",
        "bn_fold_weight",
        "bn_fold_bias",
    ] {
        assert_eq!(ops_after.get(op), None, "{op} left: {ops_after:?}");
    }
    assert!(json_counts(&v, "ops_before")["batch_norm"] > 0);
}

/// A written-out float attribute matches the model's within the documented tolerance:
/// `alpha=0.1666667` (seven digits) fuses the exporter's `0.16666667` and explain shows
/// both values; `alpha=0.166667` (six digits) does not fuse, and explain reports the near
/// miss with both values instead of staying silent.
#[test]
fn written_out_attributes_match_within_the_tolerance_or_are_near_misses() {
    let model = "tests/cases/rule_check/hard_swish_block.tir";
    let explain = |rules: &str, json: bool| {
        // without the built-in rule of the same law, which would fuse the model first
        let mut args = vec![
            "explain",
            model,
            "--rules",
            rules,
            "--disable-rules",
            "recognize-hard-swish",
        ];
        if json {
            args.push("--json");
        }
        let o = common::smelt(&args);
        assert!(o.status.success(), "{}", common::stderr(&o));
        common::stdout(&o)
    };

    let within = "tests/cases/rule_check/hard_swish_7_digits.rules";
    let text = explain(within, false);
    assert!(text.contains("rules:  hard-swish-7-digits"), "{text}");
    assert!(
        text.contains(
            "hard-swish-7-digits: alpha = 0.16666667 in the model, 0.1666667 in the rule: \
             within the tolerance"
        ),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&explain(within, true)).expect("JSON");
    let approximate = v["approximate"].as_array().expect("approximate");
    assert_eq!(approximate.len(), 1, "{v}");
    assert_eq!(approximate[0]["rule"], "hard-swish-7-digits");
    assert_eq!(v["near_misses"].as_array().map(Vec::len), Some(0), "{v}");

    let outside = "tests/cases/rule_check/hard_swish_6_digits.rules";
    let text = explain(outside, false);
    assert!(!text.contains("rules:  hard-swish-6-digits"), "{text}");
    assert!(
        text.contains(
            "hard-swish-6-digits refused by guard 'attributes': hard_sigmoid attributes: \
             alpha = 0.16666667 in the model, 0.166667 in the rule: outside the tolerance"
        ),
        "{text}"
    );
    let v: serde_json::Value = serde_json::from_str(&explain(outside, true)).expect("JSON");
    assert_eq!(v["approximate"].as_array().map(Vec::len), Some(0), "{v}");
    let near = v["near_misses"].as_array().expect("near_misses");
    assert!(
        near.iter()
            .any(|n| n["rule"] == "hard-swish-6-digits" && n["guard"] == "attributes"),
        "{v}"
    );
}
