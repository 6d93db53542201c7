//! Every JSON output — `verify --json`, `explain --json`, `bench --json` through the CLI,
//! `FusionReport::to_json` through the library — parses with serde_json and has exactly
//! the top-level fields docs/json.md lists for it, so the schema document cannot drift
//! from the code.

mod common;
use common::{smelt, stderr, stdout};

use std::collections::BTreeSet;

use serde_json::Value;

const VERIFY_CASE: &str = "tests/cases/verify/bn_after_relu.tir";
const PLANTED_RULES: &str = "tests/cases/verify/bn_through_relu.rules";
const FUSION_CASE: &str = "tests/cases/fusion/conv_bn_add_relu_tail.tir";

/// The field names of the first table under the docs/json.md heading that names `title`:
/// the first backquoted word of each table row.
fn documented_fields(title: &str) -> BTreeSet<String> {
    let doc = std::fs::read_to_string(common::root().join("docs/json.md")).expect("docs/json.md");
    let heading = format!("## `{title}`");
    let section: Vec<&str> = doc
        .lines()
        .skip_while(|l| !l.starts_with(&heading))
        .skip(1)
        .take_while(|l| !l.starts_with("## "))
        .collect();
    assert!(!section.is_empty(), "docs/json.md has no section {heading}");
    let fields: BTreeSet<String> = section
        .iter()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_string())
        .collect();
    assert!(!fields.is_empty(), "no field table under {heading}");
    fields
}

/// Parses `json` as one object and checks its keys are the documented ones but the
/// optional fields named in `absent`.
fn parse_documented(title: &str, json: &str, absent: &[&str]) -> Value {
    assert_eq!(json.trim().lines().count(), 1, "one line:\n{json}");
    let v: Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("{title}: not JSON ({e}):\n{json}"));
    let keys: BTreeSet<String> = v
        .as_object()
        .unwrap_or_else(|| panic!("{title}: not an object:\n{json}"))
        .keys()
        .cloned()
        .collect();
    let mut documented = documented_fields(title);
    for field in absent {
        assert!(documented.remove(*field), "{field} is not documented");
    }
    assert_eq!(keys, documented, "{title}:\n{json}");
    v
}

#[test]
fn verify_json_has_the_documented_fields() {
    let o = smelt(&[
        "verify",
        VERIFY_CASE,
        "--rules",
        PLANTED_RULES,
        "--allow-unchecked-rules",
        "--per-layer",
        "--bisect",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let v = parse_documented("smelt verify --json", &stdout(&o), &[]);
    assert_eq!(v["passed"], false);
    assert!(v["per_layer"]["first_divergence_inst"].is_u64(), "{v}");
    assert_eq!(v["bisect"]["outcome"]["kind"], "culprit", "{v}");
    let stats = &v["outputs"][0]["comparisons"][0]["stats"];
    for key in ["max_abs", "relative", "rmse", "count"] {
        assert!(stats[key].is_number(), "stats lack {key}: {stats}");
    }
    assert_eq!(v["inputs"][0]["source"], "random", "{v}");

    // Without --per-layer and --bisect, those fields are there and null.
    let o = smelt(&["verify", VERIFY_CASE, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = parse_documented("smelt verify --json", &stdout(&o), &[]);
    assert!(v["per_layer"].is_null() && v["bisect"].is_null(), "{v}");
}

#[test]
fn explain_json_has_the_documented_fields() {
    let o = smelt(&["explain", FUSION_CASE, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = parse_documented("smelt explain --json", &stdout(&o), &[]);
    let site = &v["sites"][0];
    assert!(site["merged"][0]["location"].is_string(), "{v}");
    assert!(v["functions"][0]["stop_reason"].is_string(), "{v}");
}

#[test]
fn bench_json_has_the_documented_fields() {
    let o = smelt(&[
        "bench",
        "tail:8,8",
        "--iterations",
        "2",
        "--warmup",
        "0",
        "--profile",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    // `batch` and `chunks` are there only for a model whose batch is dynamic
    let v = parse_documented("smelt bench --json", &stdout(&o), &["batch", "chunks"]);
    assert!(v["profile"][0]["loc"].is_string(), "{v}");

    // `profile` is there only when asked for.
    let o = smelt(&["bench", "tail:8,8", "--iterations", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    parse_documented(
        "smelt bench --json",
        &stdout(&o),
        &["profile", "batch", "chunks"],
    );
    let dynamic = common::root().join("examples/c/residual_block.onnx");
    let o = smelt(&[
        "bench",
        dynamic.to_str().unwrap(),
        "--iterations",
        "1",
        "--batch",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v = parse_documented("smelt bench --json", &stdout(&o), &["profile"]);
    assert_eq!(v["chunks"], serde_json::json!([2]), "{v}");
}

#[test]
fn fusion_report_json_has_the_documented_fields() {
    let path = common::root().join(FUSION_CASE);
    let mut module = smelt::load_model(&path, &Default::default()).expect("case loads");
    let cx = smelt::optimize(&mut module, &Default::default(), None).expect("optimizes");
    let report = cx.fusion_reports.first().expect("a fusion report");
    let v = parse_documented("FusionReport::to_json", &report.to_json(), &[]);
    assert!(v["sites"][0]["merged"][0].is_string(), "{v}");
    assert!(v["cost_before"].is_number(), "{v}");
}
