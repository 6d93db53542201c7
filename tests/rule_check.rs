//! `smelt check-rules`: the built-in rules pass; a file of planted unsound rules is
//! rejected with exit status 1 and each unsound rule named; an untested rule fails too,
//! with its reason; a true rule that makes the graph cyclic is reported as `cyclic`.

mod common;

use std::process::Command;

fn smelt() -> Command {
    Command::new(env!("CARGO_BIN_EXE_smelt"))
}

#[test]
fn builtin_rules_pass_the_numerical_check() {
    let out = smelt().arg("check-rules").output().expect("smelt runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rules = smelt_passes::fusion::builtin_rules();
    for r in &rules {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(&format!("{}:", r.name)))
            .unwrap_or_else(|| panic!("no line for {}:\n{stdout}", r.name));
        assert!(
            line.starts_with("ok ") || line.starts_with("proved "),
            "{line}"
        );
    }
    // the elementwise rule in one variable is proved exactly, not only sampled
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("proved   recognize-relu6:")),
        "{stdout}"
    );
}

#[test]
fn planted_unsound_rules_are_rejected() {
    let file = common::root().join("tests/cases/rule_check/unsound.rules");
    assert!(file.exists(), "{} is missing", file.display());
    let out = smelt()
        .arg("check-rules")
        .arg(&file)
        .output()
        .expect("smelt runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    for rule in [
        "relu-distributes-over-add",
        "fold-shift-into-padded-conv",
        "hard-swish-without-clip",
        "relu-of-shift",
        "relu-of-scale",
        "drop-an-operand",
    ] {
        assert!(
            stdout
                .lines()
                .any(|l| l.starts_with("UNSOUND") && l.contains(rule)),
            "{rule} not reported unsound:\n{stdout}"
        );
        assert!(stderr.contains(rule), "{stderr}");
    }
}

#[test]
fn a_malformed_rule_file_is_an_error_with_its_position() {
    let dir = std::env::temp_dir().join(format!("smelt-rule-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("bad.rules");
    std::fs::write(&file, "rule r\n  lhs (relu ?x\n  rhs ?x\n").expect("write");
    let out = smelt()
        .arg("check-rules")
        .arg(&file)
        .output()
        .expect("smelt runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("bad.rules:2:7"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

fn check(case: &str) -> (Option<i32>, String, String) {
    let file = common::root().join("tests/cases/rule_check").join(case);
    let out = smelt()
        .arg("check-rules")
        .arg(&file)
        .output()
        .expect("smelt runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn an_untested_rule_fails_the_check_with_its_reason() {
    let (code, stdout, stderr) = check("untested.rules");
    assert_eq!(code, Some(1), "{stdout}\n{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.contains("constant-first"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.starts_with("UNTESTED"), "{line}");
    assert!(line.contains("constants second"), "{line}");
    assert!(stderr.contains("constant-first (UNTESTED)"), "{stderr}");
}

#[test]
fn a_true_rule_that_makes_the_graph_cyclic_is_not_called_unsound() {
    let (code, stdout, stderr) = check("cyclic.rules");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("cyclic   relu-idempotent"), "{stdout}");
    assert!(!stdout.contains("UNSOUND"), "{stdout}");
}

#[test]
fn the_sampling_strata_are_printed_and_range_widens_the_large_one() {
    let out = smelt()
        .args(["check-rules", "--range", "1e6"])
        .output()
        .expect("smelt runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let first = stdout.lines().next().unwrap_or("");
    assert!(first.starts_with("sampled over:"), "{first}");
    assert!(
        first.contains("large ±1e6") && first.contains("wide ±20"),
        "{first}"
    );
    let bad = smelt()
        .args(["check-rules", "--range", "nan"])
        .output()
        .expect("smelt runs");
    assert_eq!(bad.status.code(), Some(1));
}
