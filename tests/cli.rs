//! The `smelt` command line as a user runs it: exit codes, outputs, error messages.

mod common;
use common::{smelt, stderr, stdout};

use std::path::{Path, PathBuf};

use smelt::ir::weights::random_f32;
use smelt::ir::{ErrorStats, Tensor};

fn write_npy(dir: &Path, name: &str, t: &Tensor) -> PathBuf {
    let path = dir.join(format!("{name}.npy"));
    std::fs::write(&path, smelt::npy::encode(t)).unwrap();
    path
}

fn read_npy(path: &Path) -> Tensor {
    smelt::npy::decode(&std::fs::read(path).unwrap()).unwrap()
}

const TAIL: &str = "tests/cases/thin_path/residual_tail.tir";

#[test]
fn run_jit_matches_run_interp() {
    let dir = tempfile::tempdir().unwrap();
    let x = Tensor::new([1, 16, 14, 14], random_f32(1, 16 * 196, -1.0, 1.0)).unwrap();
    let skip = Tensor::new([1, 16, 14, 14], random_f32(2, 16 * 196, -1.0, 1.0)).unwrap();
    let xa = format!("x={}", write_npy(dir.path(), "x", &x).display());
    let sa = format!("skip={}", write_npy(dir.path(), "skip", &skip).display());
    let jit_dir = dir.path().join("jit");
    let ref_dir = dir.path().join("ref");
    let jit = smelt(&[
        "run",
        TAIL,
        "--input",
        &xa,
        "--input",
        &sa,
        "--output-dir",
        jit_dir.to_str().unwrap(),
    ]);
    assert!(jit.status.success(), "{}", stderr(&jit));
    let interp = smelt(&[
        "run",
        TAIL,
        "--input",
        &xa,
        "--input",
        &sa,
        "--interp",
        "--output-dir",
        ref_dir.to_str().unwrap(),
    ]);
    assert!(interp.status.success(), "{}", stderr(&interp));
    let got = read_npy(&jit_dir.join("y.npy"));
    let want = read_npy(&ref_dir.join("y.npy"));
    assert_eq!(got.dims(), &[1, 16, 14, 14]);
    let e = ErrorStats::between_tensors(&got, &want).unwrap();
    assert!(e.relative <= 1e-5, "{e:?}");
}

#[test]
fn result_names_are_percent_encoded_inside_the_output_dir() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.tir");
    std::fs::write(
        &model,
        "func @main(%x: tensor<4xf32>) -> (\"/layer1/Relu_output_0\": tensor<4xf32>) {\n  %0 = relu %x : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n",
    )
    .unwrap();
    let out = dir.path().join("out");
    let o = smelt(&[
        "run",
        model.to_str().unwrap(),
        "--random-inputs",
        "1",
        "--output-dir",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let files: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files,
        vec![std::ffi::OsString::from("%2Flayer1%2FRelu_output_0.npy")]
    );
}

#[test]
fn bad_input_exits_1_with_a_located_message() {
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("bad.tir");
    std::fs::write(&model, "func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %0 = frobnicate %x : tensor<4xf32>\n  return %0 : tensor<4xf32>\n}\n").unwrap();
    for cmd in ["opt", "run"] {
        let mut args = vec![cmd, model.to_str().unwrap()];
        if cmd == "run" {
            args.extend(["--random-inputs", "1", "--output-dir", "unused"]);
        }
        let o = smelt(&args);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", stderr(&o));
        let err = stderr(&o);
        assert!(
            err.contains("frobnicate") && err.contains("bad.tir:2:"),
            "{cmd}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn missing_input_and_missing_file_exit_1() {
    let o = smelt(&["run", TAIL, "--output-dir", "unused"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("missing input %x"), "{}", stderr(&o));
    let o = smelt(&["opt", "does/not/exist.tir"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("does/not/exist.tir"), "{}", stderr(&o));
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(smelt(&["frobnicate"]).status.code(), Some(2));
    assert_eq!(smelt(&["run"]).status.code(), Some(2));
}

#[test]
fn opt_prints_the_fused_module_and_every_stage_on_request() {
    let o = smelt(&["opt", TAIL, "--elide-weights"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("fused conv2d %x") && out.contains("post [add(_, %skip), relu]"),
        "{out}"
    );
    assert!(!out.contains("batch_norm"), "{out}");

    let o = smelt(&["opt", TAIL, "--print-ir-after-all", "--elide-weights"]);
    let out = stdout(&o);
    for pass in ["fusion", "const_fold", "dce"] {
        assert!(out.contains(&format!("IR after {pass} ")), "{out}");
    }

    let o = smelt(&["opt", TAIL, "--no-fuse", "--elide-weights"]);
    let out = stdout(&o);
    assert!(
        out.contains("batch_norm") && !out.contains("fused"),
        "{out}"
    );
}

#[test]
fn opt_output_file_round_trips_through_its_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("fused.tir");
    let o = smelt(&["opt", TAIL, "-o", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(dir.path().join("fused.safetensors").exists());
    // The written module loads and runs like the original.
    let ref_dir = dir.path().join("a");
    let got_dir = dir.path().join("b");
    for (model, d) in [
        (TAIL.to_string(), &ref_dir),
        (out.display().to_string(), &got_dir),
    ] {
        let o = smelt(&[
            "run",
            &model,
            "--random-inputs",
            "3",
            "--interp",
            "--output-dir",
            d.to_str().unwrap(),
        ]);
        assert!(o.status.success(), "{}", stderr(&o));
    }
    let e = ErrorStats::between_tensors(
        &read_npy(&got_dir.join("y.npy")),
        &read_npy(&ref_dir.join("y.npy")),
    )
    .unwrap();
    assert!(e.relative <= 1e-5, "{e:?}");
}

#[test]
fn demo_runs_every_stage_and_verifies() {
    let o = smelt(&["demo"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("fused conv2d %x"), "{out}");
    assert!(out.contains("all stages agree"), "{out}");
}

#[test]
fn bad_onnx_files_exit_1_with_a_message() {
    let dir = tempfile::tempdir().unwrap();
    let random = dir.path().join("random.onnx");
    std::fs::write(
        &random,
        smelt::npy::encode(&Tensor::new([64], random_f32(9, 64, -1.0, 1.0)).unwrap()),
    )
    .unwrap();
    let empty = dir.path().join("empty.onnx");
    std::fs::write(&empty, b"").unwrap();
    for model in [&random, &empty] {
        let o = smelt(&[
            "run",
            model.to_str().unwrap(),
            "--random-inputs",
            "1",
            "--output-dir",
            "unused",
        ]);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{}: {}",
            model.display(),
            stderr(&o)
        );
        let err = stderr(&o);
        assert!(!err.is_empty() && !err.contains("panicked"), "{err}");
    }
}

/// The README's "Adding a fusion rule" walkthrough works as written.
#[test]
fn readme_user_rule_example_recognizes_and_fuses_leaky_relu() {
    let rules = "examples/rules/leaky_relu.rules";
    let model = "examples/rules/leaky_relu_block.tir";
    let o = smelt(&["check-rules", rules]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stdout(&o).contains("proved   recognize-leaky-relu"),
        "{}",
        stdout(&o)
    );

    let without = stdout(&smelt(&["opt", model, "--elide-weights"]));
    assert!(!without.contains("leaky_relu"), "{without}");
    let o = smelt(&["opt", model, "--rules", rules, "--elide-weights"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("post [leaky_relu {alpha = 0.1}]")
            && out.matches("conv2d").count() == 1
            && !out.contains("= max "),
        "{out}"
    );
    let o = smelt(&["verify", model, "--rules", rules]);
    assert!(o.status.success(), "{}{}", stdout(&o), stderr(&o));
}

/// `--threads` splits output tiles only, so `run` writes byte-identical results at 1, 2
/// and the default (one per core) threads; `--interp` refuses it; a silly count is a usage
/// error.
#[test]
fn run_threads_give_byte_identical_outputs() {
    let dir = tempfile::tempdir().unwrap();
    let run = |threads: Option<&str>| {
        let out = dir
            .path()
            .join(format!("t{}", threads.unwrap_or("default")));
        let mut args = vec![
            "run",
            TAIL,
            "--random-inputs",
            "3",
            "--output-dir",
            out.to_str().unwrap(),
        ];
        if let Some(t) = threads {
            args.extend(["--threads", t]);
        }
        let o = smelt(&args);
        assert!(o.status.success(), "--threads {threads:?}: {}", stderr(&o));
        std::fs::read(out.join("y.npy")).unwrap()
    };
    let one = run(Some("1"));
    assert_eq!(
        one.len(),
        128 + 16 * 14 * 14 * 4,
        "a .npy of the tail's output"
    );
    assert!(one == run(Some("2")), "--threads 2 changed the output");
    assert!(
        one == run(None),
        "the default thread count changed the output"
    );

    let o = smelt(&[
        "run",
        TAIL,
        "--random-inputs",
        "3",
        "--interp",
        "--threads",
        "2",
        "--output-dir",
        "unused",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(stderr(&o).contains("drop --interp"), "{}", stderr(&o));
    let o = smelt(&["run", TAIL, "--threads", "100000", "--output-dir", "unused"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[test]
fn demo_takes_a_thread_count_and_reports_it() {
    let o = smelt(&["demo", "--threads", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("after warm-up, 2 threads)"), "{out}");
    assert!(out.contains("all stages agree"), "{out}");
}

/// A model with a dynamic batch needs no `--shape`: `run` takes the batch from its
/// inputs (or `--batch` for random ones) and splits it over the compiled buckets, its
/// results equal to a run specialized with `--shape`; `verify` checks the dynamic run
/// against the interpreter (`jit(dynamic)`); `bench` times it and says how it split.
#[test]
fn dynamic_batch_models_run_verify_and_bench_without_shape() {
    let model = common::root().join("examples/c/residual_block.onnx");
    let model = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let x = Tensor::new([3, 6, 9, 9], random_f32(5, 3 * 486, -1.0, 1.0)).unwrap();
    let xa = format!("x={}", write_npy(dir.path(), "x", &x).display());
    let dynamic_dir = dir.path().join("dynamic");
    let pinned_dir = dir.path().join("pinned");
    let run = |extra: &[&str], out: &Path| {
        let mut args = vec!["run", model, "--input", &xa, "--output-dir"];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        let o = smelt(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        o
    };
    let dynamic = run(&[], &dynamic_dir);
    assert!(
        stderr(&dynamic).contains(
            "dynamic batch 3: ran as chunks 3 (copies of bucket 1) (buckets compiled: 1)"
        ),
        "{}",
        stderr(&dynamic)
    );
    let buckets_dir = dir.path().join("buckets");
    let buckets = run(&["--batch-buckets"], &buckets_dir);
    assert!(
        stderr(&buckets).contains("dynamic batch 3: ran as chunks 2 + 1 (buckets compiled: 1, 2)"),
        "{}",
        stderr(&buckets)
    );
    run(&["--shape", "x=3x6x9x9"], &pinned_dir);
    let want = read_npy(&pinned_dir.join("y.npy"));
    for out in [&dynamic_dir, &buckets_dir] {
        let got = read_npy(&out.join("y.npy"));
        assert_eq!(got.dims(), &[3, 6, 9, 9]);
        let e = ErrorStats::between_tensors(&got, &want).unwrap();
        assert!(e.relative <= 1e-6, "{}: {e:?}", out.display());
    }

    // random inputs at --batch; a batch that disagrees with the given inputs is refused
    let random_dir = dir.path().join("random");
    let o = smelt(&[
        "run",
        model,
        "--random-inputs",
        "1",
        "--batch",
        "5",
        "--output-dir",
        random_dir.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(read_npy(&random_dir.join("y.npy")).dims(), &[5, 6, 9, 9]);
    let o = smelt(&[
        "run",
        model,
        "--input",
        &xa,
        "--batch",
        "2",
        "--output-dir",
        random_dir.to_str().unwrap(),
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--batch 2 disagrees"), "{}", stderr(&o));

    let o = smelt(&["verify", model, "--batch", "3", "--input-range", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("jit(dynamic) vs interp(unfused)"),
        "{}",
        stdout(&o)
    );

    let o = smelt(&[
        "bench",
        model,
        "--batch",
        "3",
        "--warmup",
        "0",
        "--iterations",
        "2",
        "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(report["batch"], 3);
    assert_eq!(report["chunks"], serde_json::json!([3]));
    assert!(report["compile_parts"]["bucket_1_ms"].as_f64().unwrap() > 0.0);
    // a profile times the one bucket that runs the batch; a batch run as copies of a
    // smaller bucket is refused, naming the pins that would profile one executable
    let o = smelt(&[
        "bench",
        model,
        "--profile",
        "--warmup",
        "0",
        "--iterations",
        "2",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("op / user nodes"), "{}", stdout(&o));
    let o = smelt(&["bench", model, "--batch", "3", "--profile"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("copies of bucket 1") && stderr(&o).contains("--shape x=1x6x9x9"),
        "{}",
        stderr(&o)
    );
}

/// A model with a dynamic sequence length needs no `--shape` either: `run` pads a run of
/// `--sequence 100` to the 128 bucket and writes results 100 long, `verify` checks the
/// padded dynamic run against the interpreter, `bench` names the bucket it compiled, and
/// a length past the largest bucket is refused.
#[test]
fn dynamic_sequence_models_run_verify_and_bench_without_shape() {
    let model = common::exported_models().join("bert_opset14/model.onnx");
    let model = model.to_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    let o = smelt(&[
        "run",
        model,
        "--random-inputs",
        "1",
        "--sequence",
        "100",
        "--output-dir",
        out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("sequence length 100") && stderr(&o).contains("1x128"),
        "{}",
        stderr(&o)
    );
    assert!(
        stderr(&o).contains("length bucket 1x128: products stop at each run's length"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        read_npy(&dir.path().join("last_hidden_state.npy")).dims(),
        &[1, 100, 384]
    );
    let o = smelt(&[
        "run",
        model,
        "--random-inputs",
        "1",
        "--sequence",
        "9999",
        "--output-dir",
        out,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("sequence length 9999"),
        "{}",
        stderr(&o)
    );

    let o = smelt(&["verify", model, "--sequence", "40", "--input-range", "1"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("jit(dynamic) vs interp(unfused)"),
        "{}",
        stdout(&o)
    );

    let o = smelt(&[
        "bench",
        model,
        "--sequence",
        "100",
        "--warmup",
        "0",
        "--iterations",
        "1",
        "--json",
        "--profile",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(report["compile_parts"]["bucket_1x128_ms"].as_f64().unwrap() > 0.0);
    // the profile is the 128 bucket's run at 100 valid rows: its products stop there
    let calls = report["profile"].as_array().expect("a profile");
    let stopping = calls
        .iter()
        .filter(|c| c["kernel"].as_str().unwrap().contains("_valid_rows"))
        .count();
    assert!(stopping > 0, "{calls:?}");
}

/// A model with image sizes (height and width) needs no `--shape`: `run`, `verify` and
/// `bench` take the sizes of its `--input` files and compile exactly those; without
/// files, or with `--batch`, the error says what to give. A recognizer whose width
/// cannot be padded runs and warns why each width compiles exactly.
#[test]
fn image_size_models_run_verify_and_bench_at_their_files_shapes() {
    let data = common::image_size_models();
    let model = data.join("segmenter/model.onnx");
    let model = model.to_str().unwrap();
    let x = format!("x={}", data.join("segmenter/x_97x203.npy").display());
    let m = format!("m={}", data.join("segmenter/m_97x203.npy").display());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    // `smelt COMMAND model --input x=… --input m=… EXTRA…`
    let with_files = |command: &str, extra: &[&str]| {
        let mut args = vec![command, model, "--input", &x, "--input", &m];
        args.extend_from_slice(extra);
        smelt(&args)
    };
    let o = with_files("run", &["--output-dir", out]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("compiled for height=97 width=203"),
        "{}",
        stderr(&o)
    );
    let got = read_npy(&dir.path().join("y.npy"));
    let want = read_npy(&data.join("segmenter/want_y_97x203.npy"));
    let e = ErrorStats::between_tensors(&got, &want).unwrap();
    assert!(e.relative <= 1e-4, "{e:?}");

    // a dump is of one executable: the error spells the pins at the files' sizes
    let o = with_files("run", &["--output-dir", out, "--dump-loops"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("--shape x=1x3x97x203 --shape m=1x1x97x203"),
        "{}",
        stderr(&o)
    );
    let o = smelt(&["run", model, "--random-inputs", "1", "--output-dir", out]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("input x is tensor<1x3xheightxwidthxf32>")
            && stderr(&o).contains("--input x=FILE.npy"),
        "{}",
        stderr(&o)
    );
    let o = smelt(&["bench", model, "--input", &x, "--batch", "2"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("--batch and --sequence do not apply"));

    let o = with_files("verify", &[]);
    assert!(o.status.success(), "{}", stdout(&o));
    assert!(stdout(&o).contains("PASS"), "{}", stdout(&o));
    let o = with_files("bench", &["--warmup", "0", "--iterations", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let report: serde_json::Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert!(report["median_ms"].as_f64().unwrap() > 0.0, "{report}");
    // a profile is of the one executable compiled at the files' sizes
    let o = with_files(
        "bench",
        &["--warmup", "0", "--iterations", "1", "--profile"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("op / user nodes"), "{}", stdout(&o));

    let recognizer = data.join("recognizer/model.onnx");
    let x = format!("x={}", data.join("recognizer/x_32x257.npy").display());
    let o = smelt(&[
        "run",
        recognizer.to_str().unwrap(),
        "--input",
        &x,
        "--output-dir",
        out,
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("warning[sequence-not-paddable]")
            && stderr(&o).contains("compiled exactly"),
        "{}",
        stderr(&o)
    );
    assert_eq!(
        read_npy(&dir.path().join("probs.npy")).dims(),
        &[1, 128, 12]
    );
}
