//! Helpers shared by the integration tests: snapshot settings and case-file discovery.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The repository root (where the top-level `snapshots/` and `tests/cases/` live).
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// insta settings that store snapshots in `snapshots/<stage>/NAME.snap` at the top level,
/// named exactly as the caller says (no module prefix), so names are stable.
pub fn snapshot_settings(stage: &str) -> insta::Settings {
    let mut s = insta::Settings::clone_current();
    s.set_snapshot_path(root().join("snapshots").join(stage));
    s.set_prepend_module_to_snapshot(false);
    s.set_omit_expression(true);
    s
}

/// Every `*.tir` case under `tests/cases/<stage>/`, sorted by name. Fails (never skips)
/// when the folder is missing or empty.
pub fn case_files(stage: &str) -> Vec<PathBuf> {
    let dir = root().join("tests").join("cases").join(stage);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("case folder {} is missing: {e}", dir.display()))
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "tir"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .tir cases in {}", dir.display());
    files
}

/// The case's name: its file stem.
pub fn case_name(path: &Path) -> String {
    path.file_stem()
        .expect("case file has a name")
        .to_string_lossy()
        .into_owned()
}
