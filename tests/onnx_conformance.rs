//! Conformance: ONNX's own backend node tests and the pytorch-converted cases shipped in
//! the onnx wheel, run through `smelt::onnx::import` and the reference interpreter.
//!
//! A case is in scope when every op in its model is one smelt imports; every in-scope
//! case must match ONNX's expected outputs (|got − want| <= atol + rtol·|want| with
//! ONNX's tolerances, at most rtol 1e-3 and atol 1e-7) unless it is listed in
//! [`KNOWN_FAILURES`] with its reason — and a listed case that passes fails the test,
//! so the list stays exact. Inputs that are not float32 (shapes, axes, indices) are
//! frozen as constants with `ImportOptions::constant_inputs`, since smelt's shapes
//! are static.
//!
//! Data: `scripts/gen_onnx_tests.py` writes it to `target/onnx-tests/conformance`; this
//! test runs it through `$SMELT_PYTHON` (set by `scripts/test.sh`) when it is missing.

mod common;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use prost::Message;
use smelt::ir::{interp, DType, Op, Tensor};
use smelt::onnx::proto::{ModelProto, TensorProto};
use smelt::onnx::tensor::ConstTensor;
use smelt::onnx::{import, supported_op_types, ImportOptions};

const INTEGER: &str = "integer tensors: smelt computes in float32 (integers only as folded shapes)";
const SPATIAL_3D: &str = "3 spatial dimensions: smelt's conv and pools are 1-D and 2-D";
const TRAINING: &str = "training mode: smelt runs inference";
const GATHER: &str = "Gather of run-time data: smelt folds Gather only on constants";
const LEGACY_ADD: &str =
    "Add of opset 6 (its legacy broadcast attribute): smelt maps Add from opset 7";

/// In-scope cases that fail, with the reason. Keep sorted.
const KNOWN_FAILURES: &[(&str, &str)] = &[
    ("test_AvgPool3d", SPATIAL_3D),
    ("test_AvgPool3d_stride", SPATIAL_3D),
    ("test_AvgPool3d_stride1_pad0_gpu_input", SPATIAL_3D),
    ("test_Conv3d", SPATIAL_3D),
    ("test_Conv3d_dilated", SPATIAL_3D),
    ("test_Conv3d_dilated_strided", SPATIAL_3D),
    ("test_Conv3d_groups", SPATIAL_3D),
    ("test_Conv3d_no_bias", SPATIAL_3D),
    ("test_Conv3d_stride", SPATIAL_3D),
    ("test_Conv3d_stride_padding", SPATIAL_3D),
    ("test_MaxPool3d", SPATIAL_3D),
    ("test_MaxPool3d_stride", SPATIAL_3D),
    ("test_MaxPool3d_stride_padding", SPATIAL_3D),
    ("test_Softsign", LEGACY_ADD),
    ("test_add_uint32", INTEGER),
    ("test_add_uint64", INTEGER),
    ("test_averagepool_3d_default", SPATIAL_3D),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_False",
        SPATIAL_3D,
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_0_ceil_mode_is_True",
        SPATIAL_3D,
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_False",
        SPATIAL_3D,
    ),
    (
        "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True",
        SPATIAL_3D,
    ),
    ("test_averagepool_3d_dilations_small", SPATIAL_3D),
    ("test_batchnorm_epsilon_training_mode", TRAINING),
    ("test_batchnorm_example_training_mode", TRAINING),
    ("test_clip_default_int8_inbounds", INTEGER),
    ("test_clip_default_int8_max", INTEGER),
    ("test_clip_default_int8_min", INTEGER),
    ("test_div_uint32", INTEGER),
    ("test_div_uint64", INTEGER),
    ("test_gather_0", GATHER),
    ("test_gather_1", GATHER),
    ("test_gather_2d_indices", GATHER),
    ("test_gather_negative_indices", GATHER),
    ("test_maxpool_2d_uint8", INTEGER),
    ("test_maxpool_3d_default", SPATIAL_3D),
    ("test_maxpool_3d_dilations", SPATIAL_3D),
    ("test_maxpool_3d_dilations_use_ref_impl", SPATIAL_3D),
    ("test_maxpool_3d_dilations_use_ref_impl_large", SPATIAL_3D),
    ("test_mul_uint32", INTEGER),
    ("test_mul_uint64", INTEGER),
    ("test_sub_uint32", INTEGER),
    ("test_sub_uint64", INTEGER),
    ("test_training_dropout", TRAINING),
    ("test_training_dropout_default", TRAINING),
    ("test_training_dropout_default_mask", TRAINING),
    ("test_training_dropout_mask", TRAINING),
    ("test_training_dropout_zero_ratio", TRAINING),
    ("test_training_dropout_zero_ratio_mask", TRAINING),
];

/// Ops with extra outputs smelt does not compute: when a case's graph also returns those,
/// they are removed from the graph before import and only the first output is checked.
const FIRST_OUTPUT_ONLY: &[(&str, &str)] = &[
    (
        "LayerNormalization",
        "the Mean and InvStdDev outputs are not computed",
    ),
    ("MaxPool", "the Indices output is not computed"),
];

const MAX_RTOL: f64 = 1e-3;
const MAX_ATOL: f64 = 1e-7;

/// The generated data folder; generates it (once per process) with `$SMELT_PYTHON`
/// if missing or stale.
fn conformance_data() -> PathBuf {
    static DATA: OnceLock<PathBuf> = OnceLock::new();
    DATA.get_or_init(generate_data).clone()
}

fn generate_data() -> PathBuf {
    common::generated_data("conformance", "gen_onnx_tests.py", "onnx 1.23.2")
}

struct Case {
    name: String,
    op_type: String,
    rtol: f64,
    atol: f64,
    dir: PathBuf,
    /// Number of graph outputs (of `output_N.pb` files).
    num_outputs: usize,
}

fn read_manifest(suite: &Path) -> Vec<Case> {
    let text = std::fs::read_to_string(suite.join("manifest.tsv"))
        .unwrap_or_else(|e| panic!("{}: {e}", suite.display()));
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            assert_eq!(f.len(), 4, "bad manifest line {l:?}");
            Case {
                name: f[0].to_string(),
                op_type: f[1].to_string(),
                rtol: f[2].parse::<f64>().expect("rtol").min(MAX_RTOL),
                atol: f[3].parse::<f64>().expect("atol").min(MAX_ATOL),
                dir: suite.join(f[0]),
                num_outputs: count_outputs(&suite.join(f[0])),
            }
        })
        .collect()
}

fn count_outputs(case: &Path) -> usize {
    (0..)
        .take_while(|j| {
            case.join(format!("test_data_set_0/output_{j}.pb"))
                .is_file()
        })
        .count()
}

fn read_pb(path: &Path) -> TensorProto {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    TensorProto::decode(bytes.as_slice()).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Largest errors seen for a case: max |got − want| and max |got − want| / max |want|.
#[derive(Default, Clone, Copy)]
struct Errors {
    max_abs: f64,
    relative: f64,
}

/// Runs one case; `Err` says why it failed.
fn run_case(case: &Case) -> Result<Errors, String> {
    let mut model_bytes = std::fs::read(case.dir.join("model.onnx")).map_err(|e| e.to_string())?;
    let mut model = ModelProto::decode(model_bytes.as_slice()).map_err(|e| e.to_string())?;
    if first_output_only(case) {
        if let Some(g) = model.graph.as_mut() {
            g.output.truncate(1);
        }
        model_bytes = model.encode_to_vec();
    }
    let graph = model.graph.as_ref().ok_or("no graph")?;
    let initializers: Vec<&str> = graph.initializer.iter().map(|t| t.name()).collect();
    let data = case.dir.join("test_data_set_0");
    let mut opts = ImportOptions::default();
    let mut inputs = Vec::new();
    let real_inputs = graph
        .input
        .iter()
        .filter(|i| !initializers.contains(&i.name()));
    for (j, input) in real_inputs.enumerate() {
        let t = read_pb(&data.join(format!("input_{j}.pb")));
        let c = ConstTensor::from_proto(&t)?;
        match c.f32s() {
            Some(values) => inputs.push(Tensor::new(c.dims.clone(), values.into_owned())?),
            None => {
                opts.constant_inputs.insert(input.name().to_string(), t);
            }
        }
    }
    let module = import(&model_bytes, &opts).map_err(|e| format!("import: {e}"))?;
    let func = &module.funcs[0];
    let needs_run = func
        .results
        .iter()
        .any(|r| func.type_of(r.value).dtype == DType::F32);
    let outputs = if needs_run {
        interp::run(&module, func, &inputs).map_err(|e| format!("interpreter: {e}"))?
    } else {
        Vec::new()
    };
    let mut worst = Errors::default();
    for (j, result) in func.results.iter().enumerate() {
        let want = ConstTensor::from_proto(&read_pb(&data.join(format!("output_{j}.pb"))))?;
        let ty = func.type_of(result.value);
        if ty.dims != want.dims {
            return Err(format!(
                "output {j}: shape {:?}, expected {:?}",
                ty.dims, want.dims
            ));
        }
        if ty.dtype == DType::I64 {
            let got = match func.inst_of(result.value).map(|i| &i.op) {
                Some(Op::Const(id)) => module.weights.get(*id).map(|w| w.data.as_i64().to_vec()),
                _ => None,
            }
            .ok_or(format!(
                "output {j}: an int64 result that is not a constant"
            ))?;
            if Some(&got[..]) != want.i64s() {
                return Err(format!("output {j}: {got:?}, expected {:?}", want.i64s()));
            }
            continue;
        }
        let want = want.f32s().ok_or(format!(
            "output {j}: expected {} values, smelt computes float32",
            want.type_name()
        ))?;
        let got = outputs[j].to_row_major();
        let max_ref = want.iter().fold(0f64, |m, &v| {
            if v.is_finite() {
                m.max((v as f64).abs())
            } else {
                m
            }
        });
        for (k, (&g, &w)) in got.iter().zip(want.iter()).enumerate() {
            let (g, w) = (g as f64, w as f64);
            let same_special = (g.is_nan() && w.is_nan()) || (g.is_infinite() && g == w);
            if same_special {
                continue;
            }
            let diff = (g - w).abs();
            // written so that a NaN difference fails
            let within = diff <= case.atol + case.rtol * w.abs();
            if !within {
                return Err(format!(
                    "output {j} element {k}: got {g}, expected {w} (|diff| {diff:.3e} > atol {:e} + rtol {:e}·|want|)",
                    case.atol, case.rtol
                ));
            }
            worst.max_abs = worst.max_abs.max(diff);
            if max_ref > 0.0 {
                worst.relative = worst.relative.max(diff / max_ref);
            }
        }
    }
    Ok(worst)
}

/// Whether the case is checked on its first output only (see [`FIRST_OUTPUT_ONLY`]).
fn first_output_only(case: &Case) -> bool {
    FIRST_OUTPUT_ONLY.iter().any(|(op, _)| *op == case.op_type) && case.num_outputs > 1
}

fn model_op_types(dir: &Path) -> Vec<String> {
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap_or_default();
    let model = ModelProto::decode(bytes.as_slice()).unwrap_or_default();
    let mut ops: Vec<String> = model
        .graph
        .iter()
        .flat_map(|g| g.node.iter().map(|n| n.op_type().to_string()))
        .collect();
    ops.sort();
    ops.dedup();
    ops
}

#[derive(Default)]
struct OpTally {
    passed: usize,
    total: usize,
    known: usize,
    first_output_only: usize,
    out_of_scope: usize,
    worst: Errors,
}

fn run_suite(suite: &str) -> Vec<String> {
    let dir = conformance_data().join(suite);
    let supported: Vec<&str> = supported_op_types().collect();
    let known: BTreeMap<&str, &str> = KNOWN_FAILURES.iter().copied().collect();
    let mut tally: BTreeMap<String, OpTally> = BTreeMap::new();
    let mut problems = Vec::new();
    for case in read_manifest(&dir) {
        let ops = model_op_types(&case.dir);
        let unsupported: Vec<&String> = ops
            .iter()
            .filter(|o| !supported.contains(&o.as_str()))
            .collect();
        let relevant = supported.contains(&case.op_type.as_str());
        if !relevant && !unsupported.is_empty() {
            continue;
        }
        let t = tally.entry(case.op_type.clone()).or_default();
        if !unsupported.is_empty() {
            t.out_of_scope += 1;
            continue;
        }
        t.total += 1;
        let result = catch_unwind(AssertUnwindSafe(|| run_case(&case)))
            .unwrap_or_else(|_| Err("PANICKED".to_string()));
        match (result, known.get(case.name.as_str())) {
            (Ok(e), None) => {
                t.passed += 1;
                t.first_output_only += usize::from(first_output_only(&case));
                t.worst.max_abs = t.worst.max_abs.max(e.max_abs);
                t.worst.relative = t.worst.relative.max(e.relative);
            }
            (Ok(_), Some(_)) => problems.push(format!(
                "{suite}/{}: passes but is listed in KNOWN_FAILURES; remove it",
                case.name
            )),
            (Err(_), Some(_)) => t.known += 1,
            (Err(m), None) => {
                problems.push(format!("{suite}/{} ({}): {m}", case.name, case.op_type))
            }
        }
    }
    println!(
        "{suite}: op: passed/in scope (known failures, passed on first output only, \
         cases using unsupported ops) max abs err, max rel err"
    );
    for (op, t) in &tally {
        println!(
            "  {op:<20} {:>3}/{:<3} ({} known, {} first output only, {} out of scope)  {:.2e} {:.2e}",
            t.passed,
            t.total,
            t.known,
            t.first_output_only,
            t.out_of_scope,
            t.worst.max_abs,
            t.worst.relative
        );
    }
    let (p, n) = tally
        .values()
        .fold((0, 0), |(p, n), t| (p + t.passed, n + t.total));
    println!("{suite}: {p} of {n} in-scope cases pass");
    problems
}

#[test]
fn onnx_backend_node_tests() {
    let problems = run_suite("node");
    assert!(
        problems.is_empty(),
        "{} failing cases:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn onnx_pytorch_converted_tests() {
    let problems = run_suite("pytorch-converted");
    assert!(
        problems.is_empty(),
        "{} failing cases:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn every_known_failure_names_an_existing_case() {
    let dir = conformance_data();
    for (name, reason) in KNOWN_FAILURES {
        assert!(!reason.is_empty(), "{name} needs a reason");
        let exists = ["node", "pytorch-converted"]
            .iter()
            .any(|s| dir.join(s).join(name).is_dir());
        assert!(
            exists,
            "KNOWN_FAILURES lists {name}, which is not a generated case"
        );
    }
    assert!(
        KNOWN_FAILURES.windows(2).all(|w| w[0].0 < w[1].0),
        "KNOWN_FAILURES is not sorted"
    );
}
