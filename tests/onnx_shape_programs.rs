//! Exporter-style shape programs (Shape → Gather/Cast/arithmetic/Range/Equal/Where →
//! Reshape) folded at import: each model runs through `smelt run` (the JIT) and is compared
//! with onnxruntime; int64 arithmetic above 2^24 stays exact; bad programs get a clear
//! error naming the node.
//!
//! Data: `scripts/make_shape_programs.py` writes it to `target/onnx-tests/shape-programs`;
//! this test runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;

use std::path::PathBuf;
use std::sync::OnceLock;

use smelt::ir::ErrorStats;
use smelt::onnx::{import, ImportOptions};

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-4;

fn data_dir() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "shape-programs",
            "make_shape_programs.py",
            "onnx 1.23.2 onnxruntime 1.32.0 shape-programs 4",
        )
    })
    .clone()
}

/// Runs MODEL through `smelt run` and compares its output with onnxruntime's; returns
/// the relative error.
fn check(name: &str) -> f64 {
    let dir = data_dir().join(name);
    let out = tempfile::tempdir().unwrap();
    let model = dir.join("model.onnx");
    let input = format!("x={}", dir.join("x.npy").display());
    let o = common::smelt(&[
        "run",
        model.to_str().unwrap(),
        "--input",
        &input,
        "--output-dir",
        out.path().to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{name}: {}", common::stderr(&o));
    let read = |p: PathBuf| smelt::npy::decode(&std::fs::read(&p).unwrap()).unwrap();
    let got = read(out.path().join("y.npy"));
    let want = read(dir.join("want.npy"));
    assert_eq!(got.dims(), want.dims(), "{name}");
    let e = ErrorStats::between_tensors(&got, &want).unwrap();
    println!(
        "{name}: max abs {:.3e}, relative {:.3e} over {} values",
        e.max_abs, e.relative, e.count
    );
    assert!(
        e.relative <= MAX_RELATIVE,
        "{name}: relative error {:.3e}",
        e.relative
    );
    e.relative
}

#[test]
fn shape_gather_unsqueeze_concat_reshape() {
    check("gather_concat");
}

#[test]
fn shape_cast_mul_cast_reshape() {
    check("cast_mul");
}

#[test]
fn range_over_size_gathers_a_constant() {
    check("range_gather");
}

#[test]
fn equal_where_pick_minus_one_for_reshape() {
    check("equal_where");
}

#[test]
fn int64_arithmetic_above_2_pow_24_is_exact() {
    // 2^24 + 1 computed from values around 2^40: a float round trip would give a wrong
    // element count (the Reshape would fail) or a factor off by one
    check("int64_exact");
}

/// The import error of bad/NAME.onnx.
fn import_error(name: &str) -> String {
    let path = data_dir().join("bad").join(format!("{name}.onnx"));
    let bytes = std::fs::read(&path).unwrap();
    match import(&bytes, &ImportOptions::default()) {
        Ok(_) => panic!("{name}: imported, expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn bad_shape_programs_get_clear_errors_naming_the_node() {
    let cases: &[(&str, &[&str])] = &[
        (
            "cast_to_string",
            &["Cast node", "casting to string is not supported"],
        ),
        (
            "cast_to_float64",
            &["Cast node", "casting to float64 is not supported"],
        ),
        (
            "cast_runtime_to_uint32",
            &[
                "Cast node",
                "computed at run time",
                "casting it to uint32 is not supported",
            ],
        ),
        ("range_delta_0", &["Range node", "delta is 0"]),
        (
            "range_huge",
            &["Range node", "4611686018427387904 elements"],
        ),
        ("mul_overflow", &["Mul node", "overflows"]),
        (
            "less_mixed_types",
            &["Less node", "must have one element type, got f32 and i64"],
        ),
    ];
    for (name, words) in cases {
        let e = import_error(name);
        for w in *words {
            assert!(e.contains(w), "{name}: '{w}' missing from: {e}");
        }
    }
}
