//! `smelt verify` as a user runs it: exit codes, the text and JSON reports, rule switches
//! and input files.

mod common;
use common::{smelt, stderr, stdout};

use smelt::ir::Tensor;

const CASE: &str = "tests/cases/verify/bn_after_relu.tir";
const PLANTED_RULES: &str = "tests/cases/verify/bn_through_relu.rules";
const PLANTED: &str = "fold-bn-through-relu";

/// `"CASE":LINE:COL` of the case line that starts with `prefix`, as locations print.
fn location_of(prefix: &str) -> String {
    let src = std::fs::read_to_string(common::root().join(CASE)).expect("case file readable");
    let (i, line) = src
        .lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with(prefix))
        .unwrap_or_else(|| panic!("{CASE} has no line starting with {prefix:?}"));
    let col = line.len() - line.trim_start().len() + 1;
    format!("\"{CASE}\":{}:{col}", i + 1)
}

/// The lines of `text` after the first line starting with `header`, up to the next line
/// that is not indented.
fn section<'a>(text: &'a str, header: &str) -> Vec<&'a str> {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(header));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no line starting with {header:?} in:\n{text}"));
    std::iter::once(first)
        .chain(lines.take_while(|l| l.starts_with(' ')))
        .collect()
}

#[test]
fn verify_passes_and_exits_zero_on_a_sound_model() {
    let o = smelt(&["verify", CASE]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    let out = stdout(&o);
    assert!(
        out.lines().last().is_some_and(|l| l.starts_with("PASS")),
        "{out}"
    );
    // three comparisons on [-1, 1], and again on each default wider range
    assert_eq!(out.matches(" ok\n").count(), 9, "nine comparisons:\n{out}");
    assert!(out.contains("on random inputs in [-20, 20]:"), "{out}");
    let o = smelt(&["verify", CASE, "--input-range", "1"]);
    assert_eq!(stdout(&o).matches(" ok\n").count(), 3, "{}", stdout(&o));
}

/// Wrong only for |x| > 3: inputs in [-1, 1] alone pass it; the wider ranges do not.
#[test]
fn verify_catches_a_rule_wrong_only_at_large_magnitudes() {
    let model = "tests/cases/verify/hard_swish_written_out.tir";
    let rules = "tests/cases/rule_check/unsound.rules";
    let o = smelt(&["verify", model, "--rules", rules]);
    assert_eq!(o.status.code(), Some(1), "{}", stdout(&o));
    assert!(
        stderr(&o).contains("failed the numerical check"),
        "{}",
        stderr(&o)
    );
    let only = "--only-rules=hard-swish-without-clip";
    let o = smelt(&[
        "verify",
        model,
        "--rules",
        rules,
        only,
        "--allow-unchecked-rules",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("warning[rule-unchecked]"), "{out}");
    let (unit, wide) = out
        .split_once("on random inputs in [-20, 20]:")
        .expect("a wide range");
    assert!(!unit.contains("FAIL"), "{out}");
    assert!(wide.contains("FAIL"), "{out}");
    let o = smelt(&[
        "verify",
        model,
        "--rules",
        rules,
        only,
        "--allow-unchecked-rules",
        "--input-range",
        "1",
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
}

/// A rule wrong only for |x| > 3 passes on [-1, 1]: `--per-layer` and `--bisect` look
/// on the first range whose outputs failed (±20 here), so they find the divergence and
/// the culprit site instead of reporting that everything agrees.
#[test]
fn per_layer_and_bisect_use_the_range_where_the_outputs_failed() {
    let model = "tests/cases/verify/hard_swish_written_out.tir";
    let o = smelt(&[
        "verify",
        model,
        "--rules",
        "tests/cases/rule_check/unsound.rules",
        "--only-rules=hard-swish-without-clip",
        "--allow-unchecked-rules",
        "--per-layer",
        "--bisect",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let where_ = "on random inputs in [-20, 20] where the outputs failed";
    assert!(
        out.contains(&format!("per layer: 1 compared, 0 skipped, {where_}")),
        "{out}"
    );
    assert!(out.contains("<- first divergence"), "{out}");
    assert!(
        out.contains(&format!("(interp(fused) vs interp(unfused)), {where_}:")),
        "{out}"
    );
    assert!(out.contains("first bad site: 1. hard_swish"), "{out}");
    assert!(!out.contains("nothing to bisect"), "{out}");

    let o = smelt(&[
        "verify",
        model,
        "--rules",
        "tests/cases/rule_check/unsound.rules",
        "--only-rules=hard-swish-without-clip",
        "--allow-unchecked-rules",
        "--per-layer",
        "--bisect",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["per_layer"]["input_range"], 20.0, "{v}");
    assert_eq!(v["bisect"]["input_range"], 20.0, "{v}");
    assert_eq!(v["bisect"]["outcome"]["kind"], "culprit", "{v}");

    // where [-1, 1] already fails, that is where they look
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        "tests/cases/verify/bn_through_relu.rules",
        "--allow-unchecked-rules",
        "--per-layer",
        "--bisect",
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["bisect"]["input_range"], 1.0, "{v}");
}

#[test]
fn verify_fails_with_exit_code_one_and_names_the_planted_rule() {
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        PLANTED_RULES,
        "--allow-unchecked-rules",
        "--per-layer",
        "--bisect",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", stderr(&o));
    assert!(stderr(&o).contains("verification failed"), "{}", stderr(&o));
    let bn = format!("batch_norm {}", location_of("%n1 = batch_norm"));

    let divergence = section(&out, "first divergence:");
    assert!(divergence[1].contains(&bn), "{out}");
    assert!(divergence[2].contains(PLANTED), "{out}");

    let culprit = section(&out, "first bad site:");
    assert!(culprit[1].contains(PLANTED), "{out}");
    assert!(culprit[2].contains(&bn), "{out}");
}

#[test]
fn disable_rules_switches_the_planted_rule_off() {
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        PLANTED_RULES,
        "--allow-unchecked-rules",
        "--disable-rules",
        PLANTED,
    ]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert!(!stdout(&o).contains(PLANTED), "{}", stdout(&o));
    // --only-rules with a rule the planted site does not need: also sound.
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        PLANTED_RULES,
        "--allow-unchecked-rules",
        "--only-rules",
        "absorb-relu",
    ]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    // --no-fuse: nothing fused, nothing to disagree about.
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        PLANTED_RULES,
        "--allow-unchecked-rules",
        "--no-fuse",
    ]);
    assert!(o.status.success(), "{}\n{}", stdout(&o), stderr(&o));
    assert!(stdout(&o).contains("fusion sites: 0"), "{}", stdout(&o));
}

#[test]
fn json_report_is_one_object_with_the_verdict() {
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        PLANTED_RULES,
        "--allow-unchecked-rules",
        "--bisect",
        "--json",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    let json = out.trim();
    assert_eq!(json.lines().count(), 1, "{json}");
    let v: serde_json::Value =
        serde_json::from_str(json).unwrap_or_else(|e| panic!("invalid JSON ({e}):\n{json}"));
    assert_eq!(v["func"], "block", "{json}");
    assert_eq!(v["passed"], false, "{json}");
    let outcome = &v["bisect"]["outcome"];
    assert_eq!(outcome["kind"], "culprit", "{json}");
    assert!(
        outcome["site"]["rules"]
            .as_array()
            .is_some_and(|rules| rules.iter().any(|r| r == PLANTED)),
        "{json}"
    );
}

#[test]
fn input_files_seed_and_rtol_are_used() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("x.npy");
    let x = Tensor::new([1, 8, 12, 12], vec![0.25; 8 * 144]).expect("tensor");
    std::fs::write(&path, smelt::npy::encode(&x)).expect("writes");
    let arg = format!("x={}", path.display());
    let o = smelt(&["verify", CASE, "--input", &arg]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("input %x: tensor<1x8x12x12xf32> (given)"));

    let o = smelt(&["verify", CASE, "--seed", "42"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("seed 42"), "{}", stdout(&o));

    // A huge tolerance lets even the planted rule pass; a negative one is refused.
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        PLANTED_RULES,
        "--allow-unchecked-rules",
        "--rtol",
        "10",
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
    let o = smelt(&["verify", CASE, "--rtol=-1"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--rtol"), "{}", stderr(&o));

    let o = smelt(&["verify", CASE, "--input", "nope=x.npy"]);
    assert_eq!(o.status.code(), Some(1));
}

#[test]
fn the_debugging_session_of_the_docs_names_the_padded_conv_rule() {
    let rules = "tests/cases/verify/shift_into_padded_conv.rules";
    let planted = "fold-shift-into-padded-conv";
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        rules,
        "--allow-unchecked-rules",
        "--per-layer",
        "--bisect",
    ]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(1), "{out}\n{}", stderr(&o));
    let conv = format!("conv2d {}", location_of("%c2 = conv2d"));
    let divergence = section(&out, "first divergence:");
    assert!(divergence[1].contains(&conv), "{out}");
    assert!(
        divergence[2].contains(&format!("{planted} (user rule)")),
        "{out}"
    );
    let culprit = section(&out, "first bad site:");
    assert!(
        culprit[1].contains(&format!("{planted} (user rule)")),
        "{out}"
    );
    assert!(culprit[2].contains(&conv), "{out}");
    let o = smelt(&[
        "verify",
        CASE,
        "--rules",
        rules,
        "--allow-unchecked-rules",
        "--disable-rules",
        planted,
    ]);
    assert!(o.status.success(), "{}", stdout(&o));
}
