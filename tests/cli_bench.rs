//! `smelt bench` and the `--dump-loops` / `--dump-clif` switches as a user runs them. No
//! assertion depends on how fast anything runs.

mod common;
use common::smelt;

use std::process::Output;

use serde_json::Value;

fn ok(o: &Output) -> String {
    assert!(
        o.status.success(),
        "smelt failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn failure(o: &Output) -> String {
    assert!(!o.status.success(), "smelt should have failed");
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn bench_json(args: &[&str]) -> Value {
    let out = ok(&smelt(args));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("not JSON ({e}):\n{out}"))
}

fn number(v: &Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("field {key} is missing or not a number in {v}"))
}

const TAIL: &str = "tests/cases/thin_path/residual_tail.tir";

#[test]
fn bench_json_reports_latency_compile_time_and_work() {
    let v = bench_json(&["bench", "tail:8,8", "--iterations", "3", "--json"]);
    for key in ["median_ms", "p10_ms", "p90_ms", "compile_ms", "gflops"] {
        assert!(number(&v, key) > 0.0, "{key} = {}", v[key]);
    }
    assert!(number(&v, "p10_ms") <= number(&v, "median_ms"));
    assert!(number(&v, "median_ms") <= number(&v, "p90_ms"));
    assert_eq!(v["samples_ms"].as_array().map(Vec::len), Some(3));
    assert_eq!(v["threads"], 1);
    assert_eq!(v["fuse"], true);
    // Conv3x3 at C=8, 8x8: 2·C·C·9 flops per pixel; BatchNorm 2, Add 1, Relu 1 per element.
    let (c, hw) = (8.0, 64.0);
    let flops = 2.0 * c * c * 9.0 * hw + 4.0 * c * hw;
    assert!(
        (number(&v, "gflop") * 1e9 - flops).abs() < 1.0,
        "{}",
        v["gflop"]
    );
    // The peak is this CPU's, measured where it has an FMA of the kernels' width.
    let kernels = v["kernels"].as_str().unwrap_or_default();
    let lanes = match kernels {
        k if k.contains("avx512") => 16,
        k if k.contains("avx2") => 8,
        _ => 4,
    };
    let measurable = smelt::microkernels::fma_peak(lanes).is_some();
    assert_eq!(
        v["peak_source"],
        if measurable { "measured" } else { "nominal" },
        "{v}"
    );
    assert!(number(&v, "peak_gflops") > 0.0);
    let parts = &v["compile_parts"];
    for key in ["load_ms", "fusion_ms", "lower_ms", "codegen_ms"] {
        assert!(parts[key].is_number(), "compile_parts lacks {key}: {parts}");
    }
}

#[test]
fn bench_without_fusion_runs_more_kernels() {
    let args = [
        "bench",
        "tail:8,8",
        "--iterations",
        "2",
        "--warmup",
        "0",
        "--json",
    ];
    let fused = bench_json(&args);
    let mut unfused_args = args.to_vec();
    unfused_args.push("--no-fuse");
    let unfused = bench_json(&unfused_args);
    assert_eq!(unfused["fuse"], false);
    assert!(
        number(&unfused, "kernel_calls") > number(&fused, "kernel_calls"),
        "fused {fused}\nunfused {unfused}"
    );
    assert_eq!(number(&unfused, "gflop"), number(&fused, "gflop"));
}

#[test]
fn bench_conv_direct_runs_fewer_kernels_than_winograd() {
    // tail:32,28: a 3x3 conv the cost model sends to Winograd (pad, two transforms and
    // the product) unless --conv direct asks for the direct kernel (pad and conv)
    let args = [
        "bench",
        "tail:32,28",
        "--iterations",
        "2",
        "--warmup",
        "0",
        "--json",
    ];
    let auto = bench_json(&args);
    let mut direct_args = args.to_vec();
    direct_args.extend(["--conv", "direct"]);
    let direct = bench_json(&direct_args);
    assert_eq!(auto["conv"], "auto");
    assert_eq!(direct["conv"], "direct");
    assert!(
        number(&direct, "kernel_calls") < number(&auto, "kernel_calls"),
        "auto {auto}\ndirect {direct}"
    );
    // Both count the model's flops as written; only Winograd executes fewer of them
    // (its product takes fewer multiplications per output than the direct conv's 9 per
    // input channel, even with its transforms counted).
    assert_eq!(auto["gflop"], direct["gflop"]);
    assert!(
        number(&auto, "executed_gflop") < 0.8 * number(&direct, "executed_gflop"),
        "auto {auto}\ndirect {direct}"
    );
    assert!(
        number(&direct, "executed_gflop") > 0.9 * number(&direct, "gflop"),
        "{direct}"
    );
    let err = failure(&smelt(&["bench", "tail:8,8", "--conv", "fast"]));
    assert!(err.contains("--conv"), "{err}");
}

#[test]
fn bench_profile_lists_every_kernel_call() {
    let v = bench_json(&[
        "bench",
        TAIL,
        "--iterations",
        "2",
        "--profile",
        "--threads",
        "2",
        "--kernels",
        "cranelift",
        "--json",
    ]);
    let rows = v["profile"].as_array().expect("a profile array");
    assert_eq!(rows.len() as f64, number(&v, "kernel_calls"));
    assert!(rows
        .iter()
        .any(|r| r["op"].as_str().is_some_and(|op| op.contains("conv2d"))));
    assert_eq!(v["kernels"], "cranelift");
    assert_eq!(v["threads"], 2);

    let text = ok(&smelt(&[
        "bench",
        "tail:8,8",
        "--iterations",
        "2",
        "--profile",
    ]));
    for needle in [
        "latency  median",
        "kernels auto (",
        "% of the f32x",
        "compile",
        "total of the kernel calls",
    ] {
        assert!(text.contains(needle), "no '{needle}' in:\n{text}");
    }
}

#[test]
fn bench_rejects_bad_models_by_name() {
    let err = failure(&smelt(&["bench", "tail:0,5"]));
    assert!(err.contains("tail:C,HW"), "{err}");
    let err = failure(&smelt(&["bench", "no/such/model.onnx"]));
    assert!(err.contains("no/such/model.onnx"), "{err}");
    let err = failure(&smelt(&["bench", "tail:8,8", "--iterations", "0"]));
    assert!(err.contains("--iterations"), "{err}");
}

#[test]
fn dump_loops_prints_every_kernel_and_dump_clif_writes_one_file_each() {
    let loops = ok(&smelt(&["opt", TAIL, "--elide-weights", "--dump-loops"]));
    let kernels: Vec<&str> = loops
        .lines()
        .filter_map(|l| l.strip_prefix("kernel @"))
        .collect();
    assert!(!kernels.is_empty(), "no kernels in:\n{loops}");
    assert!(loops.contains("steps:"), "{loops}");
    assert!(loops.contains("func @tail"), "the module is printed too");

    let dir = tempfile::tempdir().unwrap();
    let clif_dir = dir.path().join("clif");
    ok(&smelt(&[
        "opt",
        TAIL,
        "--dump-clif",
        clif_dir.to_str().unwrap(),
    ]));
    let mut files: Vec<_> = std::fs::read_dir(&clif_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    assert_eq!(files.len(), kernels.len(), "{files:?}");
    for f in &files {
        assert_eq!(f.extension().and_then(|e| e.to_str()), Some("clif"));
        let text = std::fs::read_to_string(f).unwrap();
        assert!(text.starts_with("; kernel "), "{}", f.display());
        assert!(
            text.contains("function ") && text.contains("return"),
            "{text}"
        );
    }

    let out_dir = dir.path().join("out");
    let run = ok(&smelt(&[
        "run",
        TAIL,
        "--random-inputs",
        "1",
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--dump-loops",
    ]));
    assert!(run.contains("steps:") && run.contains("y.npy"), "{run}");
    let err = failure(&smelt(&[
        "run",
        TAIL,
        "--random-inputs",
        "1",
        "--output-dir",
        out_dir.to_str().unwrap(),
        "--interp",
        "--dump-loops",
    ]));
    assert!(err.contains("--interp"), "{err}");
}

#[test]
fn bench_takes_the_inputs_whose_values_matter_from_npy_files() {
    // an embedding lookup: random ids would fall outside the 3-row table and stop the run
    let dir = tempfile::tempdir().unwrap();
    let tir = dir.path().join("lookup.tir");
    std::fs::write(
        &tir,
        "const @table : tensor<3x2xf32> = random<seed = 1, min = -1.0, max = 1.0>\n\n\
         func @lookup(%ids: tensor<4xi64>, %scale: tensor<4x2xf32>) -> (y: tensor<4x2xf32>) {\n\
         \x20 %t = const @table : tensor<3x2xf32>\n\
         \x20 %g = gather %t, %ids {axis = 0} : tensor<4x2xf32>\n\
         \x20 %y = mul %g, %scale : tensor<4x2xf32>\n\
         \x20 return %y : tensor<4x2xf32>\n}\n",
    )
    .unwrap();
    let ids = dir.path().join("ids.npy");
    let tensor = smelt::ir::Tensor::typed([4], vec![2i64, 0, 1, 2]).unwrap();
    std::fs::write(&ids, smelt::npy::encode(&tensor)).unwrap();
    let (tir, ids) = (tir.to_str().unwrap(), ids.to_str().unwrap());
    let given = format!("ids={ids}");
    let v = bench_json(&[
        "bench",
        tir,
        "--input",
        &given,
        "--iterations",
        "2",
        "--json",
    ]);
    assert!(number(&v, "median_ms") >= 0.0, "{v}");
    // a name the model does not have, and a file of the wrong shape, are errors
    let e = failure(&smelt(&["bench", tir, "--input", &format!("idz={ids}")]));
    assert!(e.contains("%idz") && e.contains("%ids"), "{e}");
    let e = failure(&smelt(&["bench", tir, "--input", &format!("scale={ids}")]));
    assert!(e.contains("%scale") && e.contains("[4]"), "{e}");
}
