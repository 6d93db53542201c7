//! The `.tir` case files: every `tests/cases/parse/*.tir` round-trips through the parser
//! and the canonical printer, and every `tests/cases/errors/*.tir` fails with the
//! diagnostic code its `// expect: CODE` line names. Both are snapshot-tested.

mod common;

use std::path::Path;

use smelt_ir::text::{self, PrintOptions};
use smelt_ir::{Diagnostics, Module};

/// The name a case file has in locations: its path from the repository root.
fn display_name(path: &Path) -> String {
    path.strip_prefix(common::root())
        .unwrap_or(path)
        .display()
        .to_string()
}

fn parse_case(path: &Path) -> (Vec<u8>, Result<Module, Diagnostics>) {
    let bytes =
        std::fs::read(path).unwrap_or_else(|e| panic!("cannot read case {}: {e}", path.display()));
    let result = text::parse_bytes(&bytes, &display_name(path), path.parent());
    (bytes, result)
}

/// Print options a parse case asks for with a `// print: loc` line.
fn print_options(src: &str) -> PrintOptions {
    let wants = |word: &str| {
        src.lines()
            .filter_map(|l| l.trim().strip_prefix("// print:"))
            .any(|l| l.split(',').any(|w| w.trim() == word))
    };
    PrintOptions {
        print_loc: wants("loc"),
        ..Default::default()
    }
}

#[test]
fn parse_cases_round_trip_and_match_snapshots() {
    let files = common::case_files("parse");
    assert!(
        files.len() >= 24,
        "expected at least 24 parse cases, found {}",
        files.len()
    );
    for path in files {
        let name = common::case_name(&path);
        let (bytes, parsed) = parse_case(&path);
        let src = String::from_utf8_lossy(&bytes);
        let module = parsed
            .unwrap_or_else(|e| panic!("case {name} does not parse:\n{}", e.render(Some(&src))));
        let opts = print_options(&src);
        let printed = text::print(&module, &opts);
        let reparsed = text::parse_with(&printed, &format!("{name}.printed"), path.parent())
            .unwrap_or_else(|e| {
                panic!(
                    "printed text of {name} does not parse:\n{}\n{printed}",
                    e.render(Some(&printed))
                )
            });
        let printed_again = text::print(&reparsed, &opts);
        assert_eq!(
            printed, printed_again,
            "case {name}: parse -> print -> parse -> print is not the identity"
        );
        // Parsing the same file a second time prints the same bytes.
        let (_, second) = parse_case(&path);
        let second = second.unwrap_or_else(|e| panic!("case {name} failed the second time: {e}"));
        assert_eq!(printed, text::print(&second, &opts), "case {name}");
        common::snapshot_settings("parse").bind(|| insta::assert_snapshot!(name, printed));
    }
}

/// The code named by the case's `// expect: CODE` line.
fn expected_code(name: &str, src: &str) -> String {
    src.lines()
        .find_map(|l| l.trim().strip_prefix("// expect:"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|| panic!("error case {name} has no '// expect: CODE' line"))
}

#[test]
fn error_cases_fail_with_their_code_and_match_snapshots() {
    let files = common::case_files("errors");
    assert!(
        files.len() >= 18,
        "expected at least 18 error cases, found {}",
        files.len()
    );
    for path in files {
        let name = common::case_name(&path);
        let (bytes, parsed) = parse_case(&path);
        let src = String::from_utf8_lossy(&bytes);
        let want = expected_code(&name, &src);
        let diags = match parsed {
            Ok(m) => panic!(
                "error case {name} parsed successfully:\n{}",
                text::print(&m, &PrintOptions::default())
            ),
            Err(d) => d,
        };
        assert!(
            !diags.0.is_empty(),
            "case {name}: an error without diagnostics"
        );
        assert_eq!(
            diags.0[0].code, want,
            "case {name}: first diagnostic is {}",
            diags.0[0]
        );
        let rendered = diags.render(Some(&src));
        assert!(
            rendered.contains(&format!("{}:", display_name(&path))),
            "case {name}: the diagnostic names no position in the file:\n{rendered}"
        );
        common::snapshot_settings("errors").bind(|| insta::assert_snapshot!(name, rendered));
    }
}

#[test]
fn parse_file_reads_sidecars_from_the_files_directory() {
    let path = common::root().join("tests/cases/parse/external_weights.tir");
    let m = text::parse_file(&path).unwrap_or_else(|e| panic!("{e}"));
    let w = m
        .weights
        .get(m.weights.lookup("w").expect("weight @w"))
        .expect("data");
    // written by the case's generator as 0.5 * i - 2
    let want: Vec<f32> = (0..12).map(|i| 0.5 * i as f32 - 2.0).collect();
    assert_eq!(w.f32s(), &want[..]);
    let missing = text::parse_file(&common::root().join("tests/cases/parse/no_such_case.tir"));
    assert_eq!(missing.unwrap_err().0[0].code, "io-error");
}
