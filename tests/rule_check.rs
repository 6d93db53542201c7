//! `smelt check-rules`: the built-in rules pass with the statuses docs/rules.md lists
//! (proved, by definition, sampled for a transcendental op; z3 must be installed); a
//! file of planted unsound rules is rejected with exit status 1 and each rule `refuted`;
//! the solver proves rules in several variables and approximate ones within the
//! tolerance; an untested rule fails too,
//! with its reason; a true rule that makes the graph cyclic is reported as `cyclic`;
//! `opt --rules` refuses a refuted or untested rule, with the finding; `explain` lists a
//! user rule's refusals; a closed pipe is quiet.

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
            .find(|l| l.contains(&format!(" {}: ", r.name)))
            .unwrap_or_else(|| panic!("no line for {}:\n{stdout}", r.name));
        assert!(
            ["proved ", "by definition ", "sampled "]
                .iter()
                .any(|s| line.starts_with(s)),
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
                .any(|l| l.starts_with("refuted ") && l.contains(rule)),
            "{rule} not reported unsound:\n{stdout}"
        );
        assert!(stderr.contains(rule), "{stderr}");
    }
}

/// The three wrong rules are refused where rules load, each on its own: `opt
/// --rules` exits 1 naming the rule, `refuted`, and the counterexample (the input and
/// the constant, both sides' values).
#[test]
fn opt_refuses_each_refuted_rule_with_its_counterexample() {
    let file = common::root().join("tests/cases/rule_check/unsound.rules");
    let model = common::root().join("tests/cases/verify/hard_swish_written_out.tir");
    for (rule, constant) in [
        ("hard-swish-without-clip", "?three = 3"),
        ("relu-of-shift", "?c = "),
        ("relu-of-scale", "?c = "),
    ] {
        let out = smelt()
            .arg("opt")
            .arg(&model)
            .arg("--rules")
            .arg(&file)
            .arg(format!("--only-rules={rule}"))
            .output()
            .expect("smelt runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(out.stdout.is_empty(), "{rule}: nothing optimized");
        for part in [
            &format!("user rule '{rule}' failed the numerical check"),
            &format!("refuted  {rule}: "),
            "left-hand side = ",
            "right-hand side = ",
            "?x = ",
            constant,
        ] {
            assert!(stderr.contains(part), "{rule}: no {part:?} in {stderr}");
        }
    }
}

/// An untested rule is refused where rules load, as an unsound one is: it would
/// otherwise fire on models unchecked.
#[test]
fn opt_refuses_an_untested_rule() {
    let file = common::root().join("tests/cases/rule_check/untested.rules");
    let model = common::root().join("tests/cases/verify/hard_swish_written_out.tir");
    let out = smelt()
        .arg("opt")
        .arg(&model)
        .arg("--rules")
        .arg(&file)
        .output()
        .expect("smelt runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("user rule 'constant-first' failed the numerical check")
            && stderr.contains("UNTESTED constant-first"),
        "{stderr}"
    );
}

/// `explain` lists a user rule's refusal with its guard and reason even where a built-in
/// rule fused the op anyway, without `--only-rules`; a `scalar` guard reads a constant of
/// 17 elements.
#[test]
fn explain_lists_a_user_rules_refusal_beside_the_builtin_fusion() {
    let dir = tempfile::tempdir().expect("temp dir");
    let model = dir.path().join("hs.tir");
    std::fs::write(
        &model,
        "const @three : tensor<1xf32> = dense<3.0>\n\
         const @six : tensor<17xf32> = dense<6.0>\n\
         func @hs(%x: tensor<1x2x3x17xf32>) -> (y: tensor<1x2x3x17xf32>) {\n  \
           %t = const @three : tensor<1xf32>\n  \
           %s = const @six : tensor<17xf32>\n  \
           %a = add %x, %t : tensor<1x2x3x17xf32>\n  \
           %c = clip %a {min = 0.0, max = 6.0} : tensor<1x2x3x17xf32>\n  \
           %m = mul %x, %c : tensor<1x2x3x17xf32>\n  \
           %d = div %m, %s : tensor<1x2x3x17xf32>\n  \
           return %d : tensor<1x2x3x17xf32>\n}\n",
    )
    .expect("write the model");
    let rules = dir.path().join("hs.rules");
    // within the tolerance for its own constant (6.0001 for 6), so it loads; the model
    // divides by 6, so its guard refuses there
    std::fs::write(
        &rules,
        "rule hs-over-6-0001\n  \
           lhs (div (mul ?x (clip[min=0, max=6] (add ?x ?three))) ?six)\n  \
           rhs (hard_swish ?x)\n  \
           guard scalar ?three 3\n  \
           guard scalar ?six 6.0001\n",
    )
    .expect("write the rules");
    let out = smelt()
        .arg("explain")
        .arg(&model)
        .arg("--rules")
        .arg(&rules)
        .output()
        .expect("smelt runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("rules:  recognize-hard-swish-written-out"),
        "{stdout}"
    );
    assert!(
        stdout.contains("hs-over-6-0001 refused by guard 'scalar'")
            && stdout.contains("is the constant 6, not 6.0001"),
        "{stdout}"
    );
}

/// `smelt check-rules FILE | head -1`: the reader goes away while the rules are being
/// checked; the command ends quietly, without a panic or a broken-pipe message.
#[cfg(unix)]
#[test]
fn check_rules_into_a_closed_pipe_ends_quietly() {
    use std::process::Stdio;
    let file = common::root().join("tests/cases/rule_check/unsound.rules");
    let mut child = smelt()
        .arg("check-rules")
        .arg(&file)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("smelt runs");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("smelt ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(matches!(out.status.code(), Some(0 | 1)), "{stderr}");
    assert!(
        !stderr.contains("panicked") && !stderr.to_lowercase().contains("broken pipe"),
        "{stderr}"
    );
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
    assert!(!stdout.contains("refuted"), "{stdout}");
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

/// The SMT proofs need the `z3` binary: its absence fails here (scripts/test.sh installs
/// it), rather than every proof quietly becoming `sampled`.
#[test]
fn the_smt_solver_is_installed() {
    let out = Command::new(smelt_passes::fusion::smt::SOLVER)
        .arg("--version")
        .output();
    assert!(
        out.as_ref().is_ok_and(|o| o.status.success()),
        "`{}` is not runnable ({out:?}): install it with apt-get install -y z3",
        smelt_passes::fusion::smt::SOLVER
    );
}

/// The status of every rule in `check-rules` output, by rule name.
fn statuses(stdout: &str) -> Vec<(String, String)> {
    stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (head, _) = l.split_once(": ")?;
            let (status, rule) = head.rsplit_once(' ')?;
            Some((rule.to_string(), status.trim().to_string()))
        })
        .collect()
}

/// docs/rules.md's status table of the built-in rules is what `check-rules` says, and
/// every built-in rule is proved (or by definition), or sampled only for a transcendental
/// op the provers cannot see through.
#[test]
fn the_builtin_status_table_in_the_docs_is_what_check_rules_says() {
    let out = smelt().arg("check-rules").output().expect("smelt runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let got = statuses(&stdout);
    let docs = std::fs::read_to_string(common::root().join("docs/rules.md")).expect("docs");
    let section = docs
        .split("## Built-in rules")
        .nth(1)
        .expect("docs/rules.md has a Built-in rules section");
    let table: Vec<(String, String)> = section
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let rule = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((rule.to_string(), cells.get(2)?.to_string()))
        })
        .collect();
    assert_eq!(table, got, "docs/rules.md's table differs from:\n{stdout}");
    let rules = smelt_passes::fusion::builtin_rules();
    assert_eq!(got.len(), rules.len());
    for (rule, status) in &got {
        let line = stdout
            .lines()
            .find(|l| l.contains(&format!(" {rule}: ")))
            .unwrap_or("");
        match status.as_str() {
            "proved" | "by definition" => {}
            // an attribute that is the f32 nearest an exact value (hard_sigmoid's 1/6)
            "proved within tol" => assert!(line.contains("an f32 value stands for"), "{line}"),
            // sampled only with the reason no prover applies: a transcendental op the
            // sides do not apply to the same arguments (gelu's erf of x / 1.4142135)
            "sampled" => assert!(line.contains("uninterpreted"), "{line}"),
            other => panic!("{rule} is {other}: {line}"),
        }
        // the conv folds are proved on padded, strided and grouped instances alike
        if rule.contains("conv") && rule.starts_with("fold-") {
            let counts: Vec<usize> = ["padded in ", "strided in ", "grouped in "]
                .iter()
                .map(|key| {
                    let after = line.split(key).nth(1).unwrap_or_else(|| panic!("{line}"));
                    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
                    digits.parse().unwrap_or_else(|_| panic!("{line}"))
                })
                .collect();
            if rule == "fold-shift-into-next-conv" {
                // unpadded by its guard
                assert!(counts[1] > 0 && counts[2] > 0, "{line}");
            } else {
                assert!(counts.iter().all(|n| *n > 0), "{line}");
            }
        }
    }
}

/// Piecewise-linear rules in two variables are proved by the solver, a rule whose
/// attribute is the f32 nearest 1/6 is proved within the tolerance, and without the
/// solver the same rules are only sampled, with the ranges.
#[test]
fn the_solver_proves_rules_in_several_variables_and_approximate_ones_within_tol() {
    let (code, stdout, stderr) = check("solver.rules");
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let status = |rule: &str| {
        statuses(&stdout)
            .into_iter()
            .find(|(r, _)| r == rule)
            .map(|(_, s)| s)
            .unwrap_or_else(|| panic!("no {rule} in:\n{stdout}"))
    };
    assert_eq!(status("clip-of-a-sum"), "proved", "{stdout}");
    assert_eq!(status("max-by-min"), "proved", "{stdout}");
    assert_eq!(status("silu-spelled-out"), "proved", "{stdout}");
    assert_eq!(
        status("hard-swish-from-f32-sixth"),
        "proved within tol",
        "{stdout}"
    );
    assert!(stdout.contains("for all real inputs"), "{stdout}");

    let file = common::root().join("tests/cases/rule_check/solver.rules");
    let out = smelt()
        .arg("check-rules")
        .arg(&file)
        .arg("--no-solver")
        .output()
        .expect("smelt runs");
    let sampled = String::from_utf8_lossy(&out.stdout);
    let line = sampled
        .lines()
        .find(|l| l.contains(" clip-of-a-sum: "))
        .unwrap_or_else(|| panic!("{sampled}"));
    assert!(line.starts_with("sampled "), "{line}");
    assert!(
        line.contains("large ±1e3") && line.contains("free variable"),
        "{line}"
    );
}
