//! `smelt check-rules`: the built-in rules pass; a file of planted unsound rules is
//! rejected with exit status 1 and each unsound rule named.

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
        assert!(line.starts_with("ok "), "{line}");
    }
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
    for rule in ["relu-distributes-over-add", "fold-shift-into-padded-conv"] {
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
