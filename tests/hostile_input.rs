//! The hostile-input corpus (issue 19): inputs an attacker or a careless user hands
//! smelt — special files, paths out of the model's folder, memory bombs in small files,
//! absurd options, rules nested past any stack — each as a regression case with its
//! expected clear error.
//!
//! Every case runs the `smelt` binary under `ulimit -v` (6 GiB) and a time limit, one
//! case at a time, so a regression fails the test instead of taking the machine down.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use smelt::ir::{DType, Tensor};

/// The ONNX models of the corpus and onnxruntime's outputs for the valid ones, made by
/// `scripts/make_hostile_models.py` through `$SMELT_PYTHON` when missing.
fn onnx_data() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(|| {
        common::generated_data(
            "hostile",
            "make_hostile_models.py",
            "onnx 1.23.2 onnxruntime 1.32.0 hostile 3",
        )
    })
    .clone()
}

/// The address-space limit of every case, in KiB (6 GiB).
const ULIMIT_KIB: u64 = 6 << 20;
/// The time limit of every case.
const TIMEOUT: Duration = Duration::from_secs(10);

/// What one run of the binary did.
struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `smelt ARGS` through `sh -c 'ulimit -v ...; exec smelt "$@"'`, killing it after
/// [`TIMEOUT`]; `stdout_to` sends standard output to that file instead of a pipe.
fn smelt_in(dir: &Path, args: &[&str], stdout_to: Option<&str>) -> Outcome {
    let redirect = stdout_to.map_or(String::new(), |f| format!(" > {f}"));
    let script = format!("ulimit -v {ULIMIT_KIB}; exec \"$0\" \"$@\"{redirect}");
    // output goes to files, not pipes: a pipe nobody reads would stall a long message
    let (out_path, err_path) = (dir.join(".stdout"), dir.join(".stderr"));
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(env!("CARGO_BIN_EXE_smelt"))
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("sh runs");
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("smelt {args:?} took more than {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Outcome {
        code: status.code(),
        stdout: read(&out_path),
        stderr: read(&err_path),
    }
}

/// Expects exit status `code` and an error containing every string of `want`, never a
/// panic.
fn expect(dir: &Path, args: &[&str], code: i32, want: &[&str]) -> Outcome {
    let o = smelt_in(dir, args, None);
    assert!(
        !o.stderr.contains("panicked"),
        "smelt {args:?} panicked:\n{}",
        o.stderr
    );
    assert_eq!(o.code, Some(code), "smelt {args:?}:\n{}", o.stderr);
    for w in want {
        assert!(
            o.stderr.contains(w),
            "smelt {args:?}: want {w:?} in:\n{}",
            o.stderr
        );
    }
    o
}

/// A folder `model/` holding a tiny valid model, beside `outside/` holding a sidecar the
/// model must not read.
struct Scene {
    _root: tempfile::TempDir,
    root: PathBuf,
    model: PathBuf,
}

const TINY: &str = "func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = relu %x : tensor<4xf32>\n  return %y : tensor<4xf32>\n}\n";

fn scene() -> Scene {
    let root = tempfile::tempdir().unwrap();
    let path = root.path().canonicalize().unwrap();
    let model = path.join("model");
    std::fs::create_dir_all(&model).unwrap();
    std::fs::create_dir_all(path.join("outside")).unwrap();
    std::fs::write(model.join("tiny.tir"), TINY).unwrap();
    Scene {
        _root: root,
        root: path,
        model,
    }
}

/// A safetensors file holding one f32 tensor `w` of shape [4].
fn safetensors_w() -> Vec<u8> {
    let header = br#"{"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    for v in [1.0f32, 2.0, 3.0, 4.0] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    bytes
}

/// A model adding the external weight at `location` to its input.
fn external_model(location: &str) -> String {
    format!(
        "const @w : tensor<4xf32> = external<\"{location}\", \"w\">\n\
         func @main(%x: tensor<4xf32>) -> tensor<4xf32> {{\n  %c = const @w : tensor<4xf32>\n  \
         %y = add %x, %c : tensor<4xf32>\n  return %y : tensor<4xf32>\n}}\n"
    )
}

#[test]
fn row3_output_failures_end_with_exit_1_not_a_panic() {
    let s = scene();
    let o = smelt_in(&s.model, &["opt", "tiny.tir"], Some("/dev/full"));
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    assert!(
        o.stderr.contains("cannot write to standard output"),
        "{}",
        o.stderr
    );
    assert!(!o.stderr.contains("panicked"), "{}", o.stderr);
    let o = smelt_in(&s.model, &["--help"], Some("/dev/full"));
    assert_eq!(o.code, Some(1), "{}", o.stderr);
    // a closed pipe: the reader is gone before smelt writes; quiet, no panic
    #[cfg(unix)]
    {
        let mut child = Command::new(env!("CARGO_BIN_EXE_smelt"))
            .args(["opt", "tiny.tir"])
            .current_dir(&s.model)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert!(matches!(out.status.code(), Some(0 | 1)), "{stderr}");
        if out.status.code() == Some(1) {
            assert!(stderr.is_empty(), "a closed pipe is quiet: {stderr}");
        }
    }
}

#[test]
fn row4_numeric_options_are_range_checked() {
    let s = scene();
    for args in [
        ["bench", "tail:8,8", "--iterations", "18446744073709551615"],
        ["bench", "tail:8,8", "--iterations", "1000000000000"],
        ["bench", "tail:8,8", "--warmup", "1000000000000"],
        ["bench", "tail:8,8", "--threads", "100000"],
    ] {
        expect(&s.model, &args, 2, &["invalid value"]);
    }
    expect(
        &s.model,
        &["bench", "tail:100000,100000"],
        1,
        &["between 1 and"],
    );
    expect(&s.model, &["bench", "tail:16000,16000"], 1, &["too large"]);
}

#[test]
fn row5_special_files_are_refused_before_reading() {
    let s = scene();
    #[cfg(unix)]
    std::os::unix::fs::symlink("/dev/zero", s.model.join("zero.tir")).unwrap();
    expect(&s.model, &["opt", "zero.tir"], 1, &["not a regular file"]);
    expect(&s.model, &["opt", "."], 1, &["directory"]);
    expect(
        &s.model,
        &["opt", "tiny.tir", "--rules", "/dev/zero"],
        1,
        &["not a regular file"],
    );
    expect(
        &s.model,
        &[
            "run",
            "tiny.tir",
            "--input",
            "x=/dev/zero",
            "--output-dir",
            "o",
        ],
        1,
        &["not a regular file"],
    );
    std::fs::write(s.model.join("dz.tir"), external_model("/dev/zero")).unwrap();
    expect(&s.model, &["opt", "dz.tir"], 1, &["absolute path"]);
}

#[test]
fn row11_external_weights_stay_in_the_models_folder() {
    let s = scene();
    std::fs::write(s.root.join("outside/w.safetensors"), safetensors_w()).unwrap();
    std::fs::write(s.model.join("w.safetensors"), safetensors_w()).unwrap();
    std::fs::write(s.model.join("inside.tir"), external_model("w.safetensors")).unwrap();
    expect(&s.model, &["opt", "inside.tir"], 0, &[]);
    std::fs::write(
        s.model.join("up.tir"),
        external_model("../outside/w.safetensors"),
    )
    .unwrap();
    expect(
        &s.model,
        &["opt", "up.tir"],
        1,
        &["climbs out of the model's folder"],
    );
    let abs = s.root.join("outside/w.safetensors");
    std::fs::write(
        s.model.join("abs.tir"),
        external_model(abs.to_str().unwrap()),
    )
    .unwrap();
    expect(&s.model, &["opt", "abs.tir"], 1, &["absolute path"]);
    #[cfg(unix)]
    {
        // a symlink out: refused with the same words whether its target exists or not
        std::os::unix::fs::symlink(&abs, s.model.join("link.safetensors")).unwrap();
        let missing = s.root.join("outside/missing.safetensors");
        std::os::unix::fs::symlink(&missing, s.model.join("gone.safetensors")).unwrap();
        std::fs::write(s.model.join("link.tir"), external_model("link.safetensors")).unwrap();
        std::fs::write(s.model.join("gone.tir"), external_model("gone.safetensors")).unwrap();
        let a = expect(&s.model, &["opt", "link.tir"], 1, &["leads out of"]);
        let b = expect(&s.model, &["opt", "gone.tir"], 1, &["leads out of"]);
        let same = |t: &str| t.replace("link", "X").replace("gone", "X");
        assert_eq!(same(&a.stderr), same(&b.stderr));
        // an explicit allowed root lets it in
        let root = s.root.join("outside");
        let o = expect(
            &s.model,
            &["opt", "link.tir", "--allow-root", root.to_str().unwrap()],
            0,
            &[],
        );
        assert!(o.stdout.contains("func @main"), "{}", o.stdout);
    }
}

#[test]
fn row6_memory_bombs_in_small_files_hit_the_budget() {
    let s = scene();
    // one splat of 4 GiB: over the default budget under the 6 GiB limit (3 GiB)
    std::fs::write(
        s.model.join("splat.tir"),
        "const @w : tensor<1073741823xf32> = dense<1.0>\n\
         func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n  %y = relu %x : tensor<4xf32>\n  \
         return %y : tensor<4xf32>\n}\n",
    )
    .unwrap();
    expect(
        &s.model,
        &["opt", "splat.tir"],
        1,
        &["memory-budget", "weight @w"],
    );
    // a hundred 256 MiB random weights in 12 KB of text, against the machine's default
    // budget: the declared sizes are summed before any weight is made, so the error
    // names the first weight over it without generating the ones before
    let mut text = String::new();
    for i in 0..100 {
        text += &format!(
            "const @w{i} : tensor<67108864xf32> = random<seed = {i}, min = 0.0, max = 1.0>\n"
        );
    }
    text += "func @main(%x: tensor<67108864xf32>) -> tensor<67108864xf32> {\n";
    let mut prev = "%x".to_string();
    for i in 0..100 {
        text += &format!(
            "  %c{i} = const @w{i} : tensor<67108864xf32>\n  \
             %a{i} = add {prev}, %c{i} : tensor<67108864xf32>\n"
        );
        prev = format!("%a{i}");
    }
    text += &format!("  return {prev} : tensor<67108864xf32>\n}}\n");
    std::fs::write(s.model.join("random.tir"), text).unwrap();
    expect(
        &s.model,
        &["opt", "random.tir"],
        1,
        &[
            "memory-budget",
            "weight @w",
            "--memory-budget",
            "summed before any is made",
        ],
    );
}

#[test]
fn rows2_9_10_rule_files_are_bounded() {
    let s = scene();
    let deep = 20_000;
    let nested = format!("{}?x{}", "(relu ".repeat(deep), ")".repeat(deep));
    std::fs::write(
        s.model.join("deep.rules"),
        format!("rule deep\nlhs {nested}\nrhs ?x\n"),
    )
    .unwrap();
    expect(
        &s.model,
        &["check-rules", "deep.rules"],
        1,
        &["nests more than"],
    );
    expect(
        &s.model,
        &["opt", "tiny.tir", "--rules", "deep.rules"],
        1,
        &["nests more than"],
    );
    let many: String = (0..250_000)
        .map(|i| format!("rule r{i}\nlhs (relu ?x)\nrhs (relu ?x)\n"))
        .collect();
    std::fs::write(s.model.join("many.rules"), many).unwrap();
    expect(
        &s.model,
        &["check-rules", "many.rules"],
        1,
        &["more than 4096 rules"],
    );
    let lhs = format!(
        "rule r\n{}rhs (relu ?x)\n",
        "lhs (relu ?x)\n".repeat(100_000)
    );
    std::fs::write(s.model.join("lhs.rules"), lhs).unwrap();
    expect(&s.model, &["check-rules", "lhs.rules"], 1, &["`lhs` lines"]);
    let grow = format!(
        "rule grow\nlhs (relu ?x)\nrhs {}?x{}\n",
        "(relu ".repeat(500),
        ")".repeat(500)
    );
    std::fs::write(s.model.join("grow.rules"), grow).unwrap();
    expect(
        &s.model,
        &["opt", "tiny.tir", "--rules", "grow.rules"],
        1,
        &["nests more than"],
    );
}

#[test]
fn row13_duplicate_inputs_are_errors() {
    let s = scene();
    let npy = smelt::npy::encode(&smelt::Tensor::new([4], vec![1.0; 4]).unwrap());
    std::fs::write(s.model.join("x.npy"), npy).unwrap();
    expect(
        &s.model,
        &[
            "run",
            "tiny.tir",
            "--input",
            "x=x.npy",
            "--input",
            "x=x.npy",
            "--output-dir",
            "o",
        ],
        1,
        &["--input gives 'x' twice"],
    );
}

#[test]
fn row7_one_long_line_parses_in_linear_time() {
    // 200,000 ops on one 8 MB line: each op's column was counted from the line start,
    // so this took minutes; it must parse as fast as the same ops on separate lines.
    // A non-ASCII comment up front keeps the character-counting path in play.
    let s = scene();
    let n = 200_000;
    let mut text = String::from("// é\nfunc @main(%x: tensor<4xf32>) -> tensor<4xf32> {");
    let mut prev = "%x".to_string();
    for i in 0..n {
        text += &format!(" %a{i} = relu {prev} : tensor<4xf32>");
        prev = format!("%a{i}");
    }
    text += &format!(" return {prev} : tensor<4xf32> }}\n");
    std::fs::write(s.model.join("line.tir"), &text).unwrap();
    let o = expect(
        &s.model,
        &["opt", "line.tir", "--passes", "dce", "--print-loc"],
        0,
        &[],
    );
    // the last op's location: its column counted from the start of line 2
    let line2 = text.lines().nth(1).unwrap();
    let col = line2.find(&format!("%a{} =", n - 1)).unwrap() + 1;
    let want = format!("loc(\"line.tir\":2:{col})\n  return");
    assert!(o.stdout.contains(&want), "want {want:?}");
}

/// The f32 values of `NAME.npy` in `dir`.
fn npy_f32(dir: &Path, name: &str) -> Vec<f32> {
    let bytes = std::fs::read(dir.join(format!("{name}.npy"))).unwrap();
    let t = smelt::npy::decode(&bytes).unwrap();
    t.data.as_f32().expect("an f32 result").to_vec()
}

#[test]
fn row8_thousands_of_post_ops_compile_in_linear_time() {
    // one fused matmul and one fused conv with 30,000 post-ops each, in a varied order
    // so no two passes' kernels are the same: the register tile repeated every post-op
    // per register (and one kernel argument per binary post-op), so 10,000 took
    // a minute; the JIT's result must equal the interpreter's
    let s = scene();
    let choices = [
        "relu",
        "tanh",
        "sigmoid",
        "add(_, %b)",
        "mul(_, %b)",
        "sub(%b, _)",
        "abs",
        "neg",
        "max(_, %s)",
        "min(%s, _)",
    ];
    let mut state = 12345u64;
    let ops: Vec<&str> = (0..30_000)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            choices[(state >> 33) as usize % choices.len()]
        })
        .collect();
    let post = ops.join(", ");
    let models = [
        (
            "mm",
            format!(
                "func @main(%x: tensor<4x8xf32>, %w: tensor<8x16xf32>, %b: tensor<4x16xf32>, \
                 %s: tensor<16xf32>) -> tensor<4x16xf32> {{\n  \
                 %0 = fused matmul %x, %w post [{post}] : tensor<4x16xf32>\n  \
                 return %0 : tensor<4x16xf32>\n}}\n"
            ),
        ),
        (
            "conv",
            format!(
                "func @main(%x: tensor<1x16x8x8xf32>, %w: tensor<32x16x3x3xf32>, \
                 %b: tensor<1x32x8x8xf32>, %s: tensor<32x1x1xf32>) -> tensor<1x32x8x8xf32> {{\n  \
                 %0 = fused conv2d %x, %w {{pads = [1, 1, 1, 1]}} post [{post}] \
                 : tensor<1x32x8x8xf32>\n  return %0 : tensor<1x32x8x8xf32>\n}}\n"
            ),
        ),
    ];
    for (name, text) in models {
        let file = format!("{name}.tir");
        std::fs::write(s.model.join(&file), text).unwrap();
        let (jit, interp) = (format!("{name}_jit"), format!("{name}_interp"));
        let run = ["run", file.as_str(), "--random-inputs", "1", "--output-dir"];
        expect(&s.model, &[&run[..], &[jit.as_str()]].concat(), 0, &[]);
        let args = [&run[..], &[interp.as_str(), "--interp"]].concat();
        expect(&s.model, &args, 0, &[]);
        let (got, want) = (
            npy_f32(&s.model.join(&jit), "result0"),
            npy_f32(&s.model.join(&interp), "result0"),
        );
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert!((g - w).abs() <= 1e-4 * scale, "{name}[{i}]: {g} vs {w}");
        }
    }
}

/// Expects `got` to have the element type, shape and exact values of `want`.
fn assert_same(what: &str, got: &Tensor, want: &Tensor) {
    assert_eq!(got.dtype(), want.dtype(), "{what}: element type");
    assert_eq!(got.dims(), want.dims(), "{what}: shape");
    assert_eq!(got.data, want.data, "{what}: values");
}

#[test]
fn row1_results_keep_their_element_type() {
    // int64 bytes were written as float32 ([3e-45, 0, 4e-45] for a Shape); every result
    // must be written in its own dtype with onnxruntime's values
    let s = scene();
    let data = onnx_data();
    let shape = data.join("shape/model.onnx");
    let run = |model: &Path, out: &str, inputs: &[&str]| {
        let mut args = vec!["run", model.to_str().unwrap(), "--output-dir", out];
        args.extend_from_slice(inputs);
        expect(&s.model, &args, 0, &[]);
        s.model.join(out)
    };
    let o = run(&shape, "shape", &["--random-inputs", "1"]);
    let got = common::read_npy(&o.join("s.npy"));
    assert_eq!(got.dtype(), DType::I64);
    assert_same(
        "Shape",
        &got,
        &common::read_npy(&data.join("shape/want_s.npy")),
    );
    // Dropout in inference mode: the input, and a mask of all true
    let dropout = data.join("dropout/model.onnx");
    let o = run(&dropout, "drop", &["--random-inputs", "1"]);
    let mask = common::read_npy(&o.join("mask.npy"));
    assert_eq!(mask.dtype(), DType::Bool);
    assert_same(
        "mask",
        &mask,
        &common::read_npy(&data.join("dropout/want_mask.npy")),
    );
    let x = format!("x={}", data.join("dropout/x.npy").display());
    let o = run(&dropout, "drop_x", &["--input", &x]);
    assert_same(
        "y",
        &common::read_npy(&o.join("y.npy")),
        &common::read_npy(&data.join("dropout/want_y.npy")),
    );
    assert_same("mask", &common::read_npy(&o.join("mask.npy")), &mask);
    // a .tir returning an int64 constant, beyond float32's exact integers
    std::fs::write(
        s.model.join("i64.tir"),
        "const @big : tensor<3xi64> = dense<[1099511627777, -3, 9223372036854775807]>\n\
         func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<3xi64>) {\n  \
         %y = relu %x : tensor<4xf32>\n  %c = const @big : tensor<3xi64>\n  \
         return %y, %c : tensor<4xf32>, tensor<3xi64>\n}\n",
    )
    .unwrap();
    let o = run(&s.model.join("i64.tir"), "i64", &["--random-inputs", "1"]);
    let got = common::read_npy(&o.join("result1.npy"));
    let want = Tensor::typed([3], vec![1099511627777i64, -3, i64::MAX]).unwrap();
    assert_same("i64 constant", &got, &want);
}

#[test]
fn row13_malformed_onnx_nodes_are_errors_naming_the_node() {
    let s = scene();
    let data = onnx_data();
    let model = |name: &str| data.join(format!("{name}.onnx")).display().to_string();
    for (name, want) in [
        (
            "relu_two_inputs",
            ["Relu node 'relu_two'", "2 inputs given"],
        ),
        (
            "duplicate_attribute",
            [
                "Softmax node 'soft_twice'",
                "attribute 'axis' is given twice",
            ],
        ),
    ] {
        let m = model(name);
        expect(&s.model, &["opt", &m], 1, &want);
        expect(
            &s.model,
            &["run", &m, "--random-inputs", "1", "--output-dir", "o"],
            1,
            &want,
        );
    }
}

#[test]
fn row13_an_f64_input_that_overflows_f32_is_an_error() {
    let s = scene();
    // a float64 .npy of [1e300, 1, 2, 3]: 1e300 would become inf
    let mut npy = b"\x93NUMPY\x01\x00".to_vec();
    let mut header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }".to_string();
    while !(10 + header.len() + 1).is_multiple_of(64) {
        header.push(' ');
    }
    header.push('\n');
    npy.extend_from_slice(&(header.len() as u16).to_le_bytes());
    npy.extend_from_slice(header.as_bytes());
    for v in [1e300f64, 1.0, 2.0, 3.0] {
        npy.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(s.model.join("big.npy"), npy).unwrap();
    expect(
        &s.model,
        &[
            "run",
            "tiny.tir",
            "--input",
            "x=big.npy",
            "--output-dir",
            "o",
        ],
        1,
        &["big.npy", "1e300", "overflows float32"],
    );
}

#[test]
fn row13_a_zero_sized_dim_runs_end_to_end_as_onnxruntime_does() {
    // an ONNX input with a 0-sized dim imported to a .tir that `opt` then rejected: the
    // printed module must re-parse and verify, and every path agree with onnxruntime
    // (a product over K = 0 is the bias, a sum and a mean over the empty axis 0, `e`
    // empty)
    let s = scene();
    let data = onnx_data().join("zero_dim");
    let model = data.join("model.onnx").display().to_string();
    let printed = smelt_in(&s.model, &["opt", &model], Some("zero.tir"));
    assert_eq!(printed.code, Some(0), "opt: {}", printed.stderr);
    let text = std::fs::read_to_string(s.model.join("zero.tir")).unwrap();
    assert!(text.contains("tensor<2x0xf32>"), "{text}");
    expect(&s.model, &["opt", "zero.tir"], 0, &[]);
    expect(&s.model, &["verify", "zero.tir"], 0, &[]);
    let x = format!("x={}", data.join("x.npy").display());
    for (out, extra) in [("jit", None), ("interp", Some("--interp"))] {
        let mut args = vec!["run", &model, "--input", &x, "--output-dir", out];
        args.extend(extra);
        expect(&s.model, &args, 0, &[]);
        for name in ["y", "e"] {
            let got = common::read_npy(&s.model.join(out).join(format!("{name}.npy")));
            let want = common::read_npy(&data.join(format!("want_{name}.npy")));
            assert_same(&format!("{out} {name}"), &got, &want);
        }
    }
    // the re-parsed text runs too
    let args = ["run", "zero.tir", "--input", &x, "--output-dir", "tir"];
    expect(&s.model, &args, 0, &[]);
    let want = common::read_npy(&data.join("want_y.npy"));
    assert_same(
        "tir y",
        &common::read_npy(&s.model.join("tir/y.npy")),
        &want,
    );
    // an empty tensor holds nothing, but its other dims still bound its strides: an
    // empty axis beside two of 2^32 is as refused as any tensor of 2^64 elements
    for dims in ["0x4294967296x4294967296", "4294967296x0x4294967296"] {
        let t = format!("tensor<{dims}xf32>");
        let text =
            format!("func @f(%x: {t}) -> {t} {{\n  %y = relu %x : {t}\n  return %y : {t}\n}}\n");
        std::fs::write(s.model.join("wide.tir"), text).unwrap();
        let args = [
            "run",
            "wide.tir",
            "--random-inputs",
            "1",
            "--output-dir",
            "w",
        ];
        expect(&s.model, &args, 1, &["too large"]);
    }
}
