//! ONNX models imported with their dynamic dimensions kept as symbols (issue #23): a
//! `dim_param` becomes a symbol of that name, the module is fused once for every size,
//! then specialized at the sizes of each input file and run through the JIT against
//! onnxruntime's outputs. A model whose import depends on a size is refused with the
//! usual "pin it" error, and a note naming the node that depends on it.

mod common;

use std::path::Path;

use smelt::ir::symbolic::specialize;
use smelt::ir::text::{self, PrintOptions};
use smelt::ir::{ErrorStats, Module};
use smelt::onnx::{import_file_symbolic, ImportOptions};
use smelt::{Error, Options, Tensor};

fn import(path: &Path) -> Module {
    import_file_symbolic(path, &ImportOptions::default())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn signature(m: &Module) -> String {
    let printed = text::print(m, &PrintOptions::default());
    let line = printed
        .lines()
        .find(|l| l.starts_with("func "))
        .unwrap_or("");
    line.to_string()
}

/// Specializes the fused symbolic module at the inputs' shapes, compiles and runs it,
/// and compares with onnxruntime's output.
fn run_at(fused: &Module, inputs: &[(&str, Tensor)], want: &Tensor, what: &str) {
    let shapes = inputs
        .iter()
        .map(|(n, t)| (n.to_string(), t.ty.dims.clone()))
        .collect();
    let m = specialize(fused, &shapes).unwrap_or_else(|d| panic!("{what}: {d}"));
    let (exe, _) =
        smelt::compile(&m, &Options::default()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let tensors: Vec<Tensor> = inputs.iter().map(|(_, t)| t.clone()).collect();
    let got = exe.run(&tensors).unwrap_or_else(|e| panic!("{what}: {e}"));
    let e = ErrorStats::between_tensors(&got[0], want).unwrap_or_else(|e| panic!("{what}: {e}"));
    println!(
        "{what}: relative {:.3e} over {} values",
        e.relative, e.count
    );
    assert!(e.relative <= 1e-4, "{what}: relative {:.3e}", e.relative);
}

#[test]
fn a_recognizer_imports_with_a_symbolic_width_and_runs_every_width_from_one_fused_module() {
    let dir = common::image_size_models().join("recognizer");
    let m = import(&dir.join("model.onnx"));
    let sig = signature(&m);
    assert!(sig.contains("%x: tensor<1x3x32xwidthxf32>"), "{sig}");
    assert!(sig.contains("tensor<1x(width / 2)x12xf32>"), "{sig}");
    let mut fused = m.clone();
    smelt::optimize(&mut fused, &Default::default(), None).expect("fusion runs on symbols");
    assert!(fused.funcs[0].is_symbolic());
    for tag in ["32x100", "32x257", "32x320"] {
        let x = common::read_npy(&dir.join(format!("x_{tag}.npy")));
        let want = common::read_npy(&dir.join(format!("want_probs_{tag}.npy")));
        run_at(&fused, &[("x", x)], &want, &format!("recognizer {tag}"));
    }
}

#[test]
fn mobilenet_v3_imports_with_a_symbolic_batch() {
    let dir = common::exported_models().join("mobilenet_v3_large");
    let m = import(&dir.join("model.onnx"));
    let sig = signature(&m);
    assert!(sig.contains("%input: tensor<batchx3x224x224xf32>"), "{sig}");
    assert!(sig.contains("(logits: tensor<batchx1000xf32>)"), "{sig}");
    let mut fused = m.clone();
    smelt::optimize(&mut fused, &Default::default(), None).expect("fusion runs on symbols");
    let input = common::read_npy(&dir.join("input.npy"));
    let want = common::read_npy(&dir.join("want_logits.npy"));
    assert_eq!(input.ty.dims[0], 2, "the manifest's batch");
    run_at(
        &fused,
        &[("input", input)],
        &want,
        "mobilenet_v3_large batch 2",
    );
}

#[test]
fn a_segmenter_resizing_to_its_input_size_runs_odd_sizes_from_one_fused_module() {
    // the resize takes `sizes` read from Shape(x): its result is the input's height and
    // width, whatever they are, not twice a half
    let dir = common::image_size_models().join("segmenter");
    let m = import(&dir.join("model.onnx"));
    let printed = text::print(&m, &PrintOptions::default());
    assert!(
        printed.contains("sizes = [1, 16, height, width]"),
        "{printed}"
    );
    let reparsed = text::parse(&printed, "segmenter.tir").expect("the attribute reparses");
    assert_eq!(text::print(&reparsed, &PrintOptions::default()), printed);
    let mut fused = m.clone();
    smelt::optimize(&mut fused, &Default::default(), None).expect("fusion runs on symbols");
    for tag in ["641x479", "320x320", "97x203"] {
        let x = common::read_npy(&dir.join(format!("x_{tag}.npy")));
        let mask = common::read_npy(&dir.join(format!("m_{tag}.npy")));
        let want = common::read_npy(&dir.join(format!("want_y_{tag}.npy")));
        run_at(
            &fused,
            &[("x", x), ("m", mask)],
            &want,
            &format!("segmenter {tag}"),
        );
    }
}

#[test]
fn a_dynamo_reshape_to_the_batch_times_the_features_stays_symbolic() {
    let dir = common::exported_models().join("mobilenet_v3_small");
    let m = import(&dir.join("model.onnx"));
    let printed = text::print(&m, &PrintOptions::default());
    let batch = m.funcs[0].params[0].ty.to_string();
    assert!(
        batch.starts_with("tensor<s") && batch.ends_with("x3x224x224xf32>"),
        "{batch}"
    );
    let symbol = &batch["tensor<".len()..batch.find('x').unwrap()];
    assert!(
        printed.contains(&format!("shape = [{symbol}, 576]")),
        "{printed}"
    );
    let mut fused = m.clone();
    smelt::optimize(&mut fused, &Default::default(), None).expect("fusion runs on symbols");
    let input = common::read_npy(&dir.join("input.npy"));
    let want = common::read_npy(&dir.join("want_logits.npy"));
    run_at(&fused, &[("input", input)], &want, "mobilenet_v3_small");
}

#[test]
fn dbnet_imports_with_its_sides_multiples_of_32_and_runs_three_sizes() {
    // DBNet's FPN upsamples by a scale of 2 and adds the lateral: 2*((height + 31) / 32)
    // and (height + 15) / 16 agree only for multiples of 32, so the sides become 32 times
    // a symbol of their own (onnxruntime refuses 641×479 too)
    let dir = common::image_size_models().join("dbnet_fpn");
    let m = import(&dir.join("model.onnx"));
    let sig = signature(&m);
    assert!(
        sig.contains(r#"%x: tensor<1x3x(32*"height/32")x(32*"width/32")xf32>"#),
        "{sig}"
    );
    let mut fused = m.clone();
    smelt::optimize(&mut fused, &Default::default(), None).expect("fusion runs on symbols");
    for tag in ["320x320", "640x480", "960x960"] {
        let x = common::read_npy(&dir.join(format!("x_{tag}.npy")));
        let want = common::read_npy(&dir.join(format!("want_maps_{tag}.npy")));
        run_at(&fused, &[("x", x)], &want, &format!("dbnet {tag}"));
    }
    let shapes = [("x".to_string(), vec![1, 3, 641, 479])].into();
    let e = specialize(&fused, &shapes).unwrap_err().to_string();
    assert!(
        e.contains("input %x dimension 2 is 641")
            && e.contains(r#"no size of "height/32" gives 641"#),
        "{e}"
    );
}

#[test]
fn a_model_whose_import_depends_on_a_size_is_refused_naming_the_node() {
    // BERT's position constants are folded from the sequence length
    let bert = common::exported_models().join("bert_opset14/model.onnx");
    match import_file_symbolic(&bert, &ImportOptions::default()) {
        Err(Error::Onnx(d)) => {
            let text = d.to_string();
            assert_eq!(d.0[0].code, "onnx-dynamic-shape", "{text}");
            assert!(text.contains("cannot stay symbolic"), "{text}");
            assert!(text.contains("folds to a constant"), "{text}");
        }
        other => panic!("expected the refusal, got {:?}", other.map(|_| ())),
    }
    // pinned, it imports as before
    let pinned = ImportOptions {
        input_shapes: [
            ("input_ids".to_string(), vec![1, 16]),
            ("attention_mask".to_string(), vec![1, 16]),
            ("token_type_ids".to_string(), vec![1, 16]),
        ]
        .into(),
        ..ImportOptions::default()
    };
    let m = import_file_symbolic(&bert, &pinned).expect("imports pinned");
    assert!(!m.funcs[0].is_symbolic());
}

#[test]
fn smelt_opt_prints_the_fused_symbolic_module() {
    let path = common::image_size_models().join("recognizer/model.onnx");
    let out = common::smelt(&["opt", path.to_str().unwrap(), "--elide-weights"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = common::stdout(&out);
    assert!(text.contains("tensor<1x3x32xwidthxf32>"), "{text}");
    assert!(text.contains("fused conv2d"), "{text}");
}
