//! Every snapshot of a case-driven stage has its case file: for each `snapshots/<stage>/`
//! whose stage has a `tests/cases/<stage>/` folder, `NAME.snap` needs `NAME.tir` there.
//! insta does not notice orphaned snapshots in a top-level folder, so this test does.

mod common;

use std::path::Path;

fn snap_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "snap"))
        .map(|p| common::case_name(&p))
        .collect();
    names.sort();
    names
}

#[test]
fn every_case_snapshot_has_its_input_file() {
    let snapshots = common::root().join("snapshots");
    let cases = common::root().join("tests").join("cases");
    let mut stages: Vec<String> = std::fs::read_dir(&snapshots)
        .expect("snapshots/ exists")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.is_dir() && cases.join(p.file_name().expect("named")).is_dir())
        .map(|p| p.file_name().expect("named").to_string_lossy().into_owned())
        .collect();
    stages.sort();
    for required in ["errors", "parse"] {
        assert!(
            stages.iter().any(|s| s == required),
            "snapshots/{required}/ and tests/cases/{required}/ must both exist"
        );
    }
    let mut orphans = Vec::new();
    for stage in &stages {
        for name in snap_names(&snapshots.join(stage)) {
            if !cases.join(stage).join(format!("{name}.tir")).is_file() {
                orphans.push(format!("snapshots/{stage}/{name}.snap"));
            }
        }
    }
    assert!(
        orphans.is_empty(),
        "snapshots without a case file (delete them or restore the case):\n{}",
        orphans.join("\n")
    );
}

#[test]
fn every_parse_and_error_case_has_a_snapshot() {
    for stage in ["parse", "errors"] {
        let snaps = snap_names(&common::root().join("snapshots").join(stage));
        for case in common::case_files(stage) {
            let name = common::case_name(&case);
            assert!(
                snaps.contains(&name),
                "tests/cases/{stage}/{name}.tir has no snapshot snapshots/{stage}/{name}.snap \
                 (run the tests with INSTA_UPDATE=always and review it)"
            );
        }
    }
}
