//! Real exporters' graphs through `smelt run` (the fused JIT) against onnxruntime: the
//! model kinds of issue #21 as `torch.onnx.export` wrote them (torchvision's MobileNetV3
//! and ViT, transformers' BERT at opset 14 and 18, and DBNet-, YOLOv5- and AlexNet-style
//! modules), each within 1e-4 relative of onnxruntime on every output, with its dynamic
//! dims pinned as a user would, and `smelt verify` passing on it. Beside them, the ONNX
//! model zoo's classic CNNs (AlexNet, DenseNet-121, Inception v1 and v2, ResNet-50,
//! ShuffleNet, SqueezeNet, VGG-19, ZFNet-512) as the pinned onnx wheel ships them, with
//! seeded weights, each within 1e-4 of onnxruntime.
//!
//! Fixtures: `tests/models/exported/` holds the exported graphs without their weights and
//! a manifest of how each was exported (`scripts/export_models.py`, run by hand with
//! torch); the zoo's graphs are read from the onnx wheel. `scripts/make_exported_models.py`
//! refills both with seeded weights and computes
//! onnxruntime's outputs into `target/onnx-tests/exported`; this test runs it through
//! `$SMELT_PYTHON` (set by `scripts/test.sh`) when the data is missing.

mod common;

use std::sync::OnceLock;

use smelt::ir::ErrorStats;

/// Gate on FACTS.md's relative error: max |got − ref| / max |ref|.
const MAX_RELATIVE: f64 = 1e-4;

/// Ops that must be gone after fusion, per fixture: the activations and layer norms the
/// exporter wrote out, which a built-in rule recognizes (hard-swish as `x * HardSigmoid(x)`,
/// GELU with `erf`, LayerNorm from ReduceMean, Sqrt and Div).
const RECOGNIZED: &[(&str, &[&str])] = &[
    ("bert_opset14", &["reduce_mean", "sqrt", "erf"]),
    ("bert_opset18", &["erf"]),
    ("mobilenet_v3_large", &["hard_sigmoid"]),
];

/// The fixtures' manifest, read and parsed once per test binary.
fn manifest() -> &'static serde_json::Value {
    static MANIFEST: OnceLock<serde_json::Value> = OnceLock::new();
    MANIFEST.get_or_init(|| {
        let path = common::root().join("tests/models/exported/manifest.json");
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    })
}

/// `--shape NAME=AxBx...` for each dynamic input the manifest pins.
fn pins(entry: &serde_json::Value) -> Vec<String> {
    let pins = entry["pins"]
        .as_object()
        .expect("manifest: pins is an object");
    pins.iter()
        .flat_map(|(name, dims)| {
            let dims: Vec<String> = dims
                .as_array()
                .expect("manifest: a pin is a list of sizes")
                .iter()
                .map(|d| {
                    d.as_u64()
                        .expect("manifest: sizes are integers")
                        .to_string()
                })
                .collect();
            ["--shape".to_string(), format!("{name}={}", dims.join("x"))]
        })
        .collect()
}

/// Runs fixture `kind` with its inputs and compares every output with onnxruntime's;
/// then `smelt verify` checks it stage by stage against the interpreter.
fn check(kind: &str) {
    let entry = &manifest()[kind];
    assert!(entry.is_object(), "{kind} is not in the manifest");
    let dir = common::exported_models().join(kind);
    let model = dir.join("model.onnx");
    let out = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = vec!["run".into(), model.display().to_string()];
    for name in entry["inputs"]
        .as_object()
        .expect("manifest: inputs")
        .keys()
    {
        args.push("--input".into());
        args.push(format!(
            "{name}={}",
            dir.join(smelt::npy::file_name_for(name)).display()
        ));
    }
    args.extend(pins(entry));
    args.extend(["--output-dir".into(), out.path().display().to_string()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = common::smelt(&argv);
    assert!(o.status.success(), "{kind}: {}", common::stderr(&o));
    let mut compared = 0;
    for file in std::fs::read_dir(&dir).unwrap() {
        let file = file.unwrap().file_name().into_string().unwrap();
        let Some(output) = file.strip_prefix("want_") else {
            continue;
        };
        let want = common::read_npy(&dir.join(&file));
        let got = common::read_npy(&out.path().join(output));
        assert_eq!(got.dtype(), want.dtype(), "{kind}/{output}");
        assert_eq!(got.dims(), want.dims(), "{kind}/{output}");
        let e = ErrorStats::between_tensors(&got, &want).unwrap();
        let max_ref = want.f32s().iter().fold(0f32, |m, v| m.max(v.abs()));
        println!(
            "{kind}/{output}: max abs {:.3e}, relative {:.3e} over {} values (max |ref| {max_ref:.3e})",
            e.max_abs, e.relative, e.count
        );
        // an all-zero reference (a zero-initialized head) would make any output pass
        assert!(max_ref > 0.0, "{kind}/{output}: the reference is all zeros");
        assert!(
            e.relative <= MAX_RELATIVE,
            "{kind}/{output}: relative {:.3e}",
            e.relative
        );
        compared += 1;
    }
    assert!(
        compared > 0,
        "{kind}: no reference outputs in {}",
        dir.display()
    );
    // The zoo's kinds are checked against onnxruntime only: verify's interpreter passes
    // take 15-90 s on them (VGG-19 is 20 GFLOP), and onnxruntime is the stronger oracle.
    if entry.get("wheel").is_none() {
        let mut args: Vec<String> = vec!["verify".into(), model.display().to_string()];
        args.extend(pins(entry));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let v = common::smelt(&argv);
        let text = common::stdout(&v);
        assert!(
            v.status.success() && text.contains("PASS"),
            "{kind}: {text}{}",
            common::stderr(&v)
        );
    }
    if let Some((_, gone)) = RECOGNIZED.iter().find(|(k, _)| *k == kind) {
        let mut args: Vec<String> = vec!["opt".into(), model.display().to_string()];
        args.extend(pins(entry));
        args.push("--elide-weights".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let o = common::smelt(&argv);
        assert!(o.status.success(), "{kind}: {}", common::stderr(&o));
        let ir = common::stdout(&o);
        for op in *gone {
            let left = ir.matches(&format!(" = {op} ")).count();
            assert_eq!(left, 0, "{kind}: {left} standalone {op} left after fusion");
        }
    }
}

macro_rules! fixtures {
    ($($kind:ident),* $(,)?) => {
        $(
            #[test]
            fn $kind() {
                check(stringify!($kind));
            }
        )*

        /// Every fixture in the manifest has its test above, and every test its fixture.
        #[test]
        fn every_fixture_is_tested() {
            let listed: Vec<String> =
                manifest().as_object().unwrap().keys().cloned().collect();
            let tested = [$(stringify!($kind)),*].map(String::from);
            assert_eq!(listed, tested.to_vec(), "manifest vs tests (both sorted)");
        }
    };
}

fixtures! {
    alexnet_lrn,
    bert_opset14,
    bert_opset18,
    dbnet_fpn,
    mobilenet_v3_large,
    mobilenet_v3_small,
    vit_small,
    yolo_style,
    zoo_bvlc_alexnet,
    zoo_densenet121,
    zoo_inception_v1,
    zoo_inception_v2,
    zoo_resnet50,
    zoo_shufflenet,
    zoo_squeezenet,
    zoo_vgg19,
    zoo_zfnet512,
}
