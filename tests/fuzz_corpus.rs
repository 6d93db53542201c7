//! Replays the committed, minimized fuzz corpus (`fuzz/corpus-min/<target>/`) through the
//! very checks the fuzz targets run, so CI — which cannot run libFuzzer for minutes —
//! still catches a regression on every input the fuzzers ever found interesting.

#[allow(dead_code)]
#[path = "../fuzz/src/checks.rs"]
mod checks;
#[allow(dead_code)]
#[path = "../fuzz/src/graph_gen.rs"]
mod graph_gen;

use std::path::PathBuf;

use checks::Verdict;

type Check = fn(&[u8]) -> Result<Verdict, String>;

/// Every file of `fuzz/corpus-min/<target>/`, sorted. Fails (never skips) when the
/// folder is missing or holds fewer than `min_files` files.
fn corpus(target: &str, min_files: usize) -> Vec<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus-min")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("corpus folder {} is missing: {e}", dir.display()))
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        files.len() >= min_files,
        "{}: expected at least {min_files} corpus files, found {}",
        dir.display(),
        files.len()
    );
    files
}

/// Runs `check` on every corpus file of `target`; returns (accepted, rejected, unsupported)
/// counts after asserting that no file violates a property.
fn replay(target: &str, min_files: usize, check: Check) -> (usize, usize, usize) {
    let mut failures = Vec::new();
    let (mut passed, mut rejected, mut unsupported) = (0, 0, 0);
    for path in corpus(target, min_files) {
        let data =
            std::fs::read(&path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        match check(&data) {
            Ok(Verdict::Passed) => passed += 1,
            Ok(Verdict::Rejected) => rejected += 1,
            Ok(Verdict::Unsupported(_)) => unsupported += 1,
            Err(violation) => failures.push(format!("{}: {violation}", path.display())),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of the {target} corpus violate properties:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    (passed, rejected, unsupported)
}

#[test]
fn parse_tir_corpus_replays_clean() {
    let (passed, rejected, _) = replay("parse_tir", 20, checks::check_tir);
    assert!(
        passed >= 5,
        "only {passed} parse_tir corpus files are accepted"
    );
    assert!(
        rejected >= 5,
        "only {rejected} parse_tir corpus files are rejected"
    );
}

#[test]
fn import_onnx_corpus_replays_clean() {
    let (passed, rejected, _) = replay("import_onnx", 20, checks::check_onnx);
    assert!(passed >= 5, "only {passed} import_onnx corpus files import");
    assert!(rejected >= 1, "no import_onnx corpus file is rejected");
}

#[test]
fn load_rules_corpus_replays_clean() {
    let (passed, rejected, _) = replay("load_rules", 5, checks::check_rules);
    assert!(passed >= 1, "no load_rules corpus file loads and runs");
    assert!(rejected >= 1, "no load_rules corpus file is rejected");
}

#[test]
fn differential_corpus_replays_clean() {
    let (passed, _, unsupported) = replay("differential", 20, checks::check_differential);
    assert!(
        passed >= unsupported,
        "most differential cases should compile: {passed} passed, {unsupported} unsupported"
    );
}

#[test]
fn the_rule_target_module_parses_and_optimizes() {
    // The fixed module load_rules rewrites: it must itself be valid, or every rule
    // input would be reported as a violation.
    assert_eq!(checks::check_rules(b"# no rules\n"), Ok(Verdict::Passed));
}
