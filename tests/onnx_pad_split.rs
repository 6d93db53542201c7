//! ONNX Pad and Split on small models built here: every opset form (Pad's attributes
//! before 11 and inputs after, `axes` from 18, `wrap` from 19; Split's attribute, input,
//! `num_outputs` with an uneven last chunk, equal parts), folding of a split shape
//! vector, and bad models (run-time pads, pads of the wrong length, a reflect pad too
//! large, chunks that do not fit), each an error naming the node.

mod common;
mod onnx_build;

use onnx_build::*;

use smelt::ir::op::{PadAttrs, PadMode};
use smelt::ir::{Op, Tensor, TensorData};

const INT64: i32 = 7;

fn x34() -> Tensor {
    Tensor::new([3, 4], (0..12).map(|v| v as f32).collect()).expect("tensor")
}

#[test]
fn pad_attributes_before_opset_11_and_inputs_after_agree() {
    let old = Model::new(2)
        .input("x", &[3, 4])
        .node(
            "Pad",
            "p",
            &["x"],
            &["y"],
            vec![attr_ints("pads", &[1, 0, 0, 2]), attr_float("value", 2.5)],
        )
        .output("y")
        .import()
        .expect("import");
    let new = Model::new(13)
        .input("x", &[3, 4])
        .init(i64_typed("pads", &[1, 0, 0, 2]))
        .init(f32_typed("v", &[], &[2.5]))
        .node("Pad", "p", &["x", "pads", "v"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    let a = &run(&old, &[x34()])[0];
    let b = &run(&new, &[x34()])[0];
    assert_eq!(a.dims(), [4, 6]);
    assert_eq!(a, b);
    assert_eq!(&a.f32s()[..8], [2.5, 2.5, 2.5, 2.5, 2.5, 2.5, 0.0, 1.0]);
    // a zero value is the op's default: no fill operand
    let zero = Model::new(13)
        .input("x", &[3, 4])
        .init(i64_typed("pads", &[0, 1, 0, 1]))
        .init(f32_typed("v", &[], &[0.0]))
        .node("Pad", "p", &["x", "pads", "v"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    assert_eq!(
        ops(&zero),
        [&Op::Pad(PadAttrs {
            pads: vec![0, 1, 0, 1],
            mode: PadMode::Constant
        })]
    );
}

#[test]
fn pad_axes_from_18_and_wrap_from_19() {
    let model = |opset, mode: &str| {
        Model::new(opset)
            .input("x", &[3, 4])
            .init(i64_typed("pads", &[2, 1]))
            .init(i64_typed("axes", &[-1]))
            .node(
                "Pad",
                "p",
                &["x", "pads", "", "axes"],
                &["y"],
                vec![attr_string("mode", mode)],
            )
            .output("y")
            .import()
    };
    let m = model(19, "wrap").expect("import");
    let y = &run(&m, &[x34()])[0];
    assert_eq!(y.dims(), [3, 7]);
    assert_eq!(&y.f32s()[..7], [2.0, 3.0, 0.0, 1.0, 2.0, 3.0, 0.0]);
    let m = model(18, "reflect").expect("import");
    let y = &run(&m, &[x34()])[0];
    assert_eq!(&y.f32s()[..7], [2.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0]);
    let e = error_text(model(18, "wrap"), "onnx-bad-attribute");
    assert!(e.contains("'wrap' exists from Pad-19"), "{e}");
    let e = error_text(model(13, "edge"), "onnx-bad-model");
    assert!(e.contains("axes input exists from Pad-18"), "{e}");
}

#[test]
fn pad_of_int64_keeps_values_above_2_24_and_its_fill_exact() {
    let big = (1i64 << 40) + 1;
    let m = Model::new(13)
        .input_dims("x", INT64, &fixed(&[3]))
        .init(i64_typed("pads", &[1, 1]))
        .init(i64_typed("v", &[big + 2]))
        .node("Pad", "p", &["x", "pads", "v"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    let x = Tensor::typed([3], vec![big, -big, 0]).expect("tensor");
    let (exe, _) = smelt::compile(&m, &smelt::Options::default()).expect("compiles");
    let y = &exe.run(&[x]).expect("runs")[0];
    assert_eq!(
        y.data,
        TensorData::I64(vec![big + 2, big, -big, 0, big + 2])
    );
}

#[test]
fn bad_pads_are_errors_naming_the_node() {
    let e = error_text(
        Model::new(13)
            .input("x", &[3, 4])
            .input_dims("pads", INT64, &fixed(&[4]))
            .node("Pad", "grow", &["x", "pads"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-dynamic-shape",
    );
    assert!(e.contains("grow") && e.contains("pads"), "{e}");
    let e = error_text(
        Model::new(13)
            .input("x", &[3, 4])
            .init(i64_typed("pads", &[1, 1]))
            .node("Pad", "grow", &["x", "pads"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-bad-model",
    );
    assert!(
        e.contains("grow") && e.contains("pads has 2 entries"),
        "{e}"
    );
    let e = error_text(
        Model::new(13)
            .input("x", &[3, 4])
            .init(i64_typed("pads", &[0, 4, 0, 0]))
            .node(
                "Pad",
                "mirror",
                &["x", "pads"],
                &["y"],
                vec![attr_string("mode", "reflect")],
            )
            .output("y")
            .import(),
        "type-mismatch",
    );
    assert!(
        e.contains("mirror") && e.contains("reflect") && e.contains("smaller than the 4"),
        "{e}"
    );
    let e = error_text(
        Model::new(13)
            .input("x", &[3, 4])
            .init(i64_typed("pads", &[0, 1, 0, 0]))
            .node(
                "Pad",
                "p",
                &["x", "pads"],
                &["y"],
                vec![attr_string("mode", "mirror")],
            )
            .output("y")
            .import(),
        "onnx-bad-attribute",
    );
    assert!(e.contains("'mirror' is not a pad mode"), "{e}");
}

#[test]
fn split_in_every_opset_form() {
    let x = Tensor::new([7], (0..7).map(|v| v as f32).collect()).expect("tensor");
    let outputs = |m: &smelt::ir::Module| -> Vec<Vec<f32>> {
        run(m, std::slice::from_ref(&x))
            .iter()
            .map(|t| t.f32s().to_vec())
            .collect()
    };
    let attr = Model::new(2)
        .input("x", &[7])
        .node(
            "Split",
            "s",
            &["x"],
            &["a", "b"],
            vec![attr_ints("split", &[3, 4])],
        )
        .output("a")
        .output("b")
        .import()
        .expect("import");
    assert_eq!(
        outputs(&attr),
        [vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0, 6.0]]
    );
    let input = Model::new(13)
        .input("x", &[7])
        .init(i64_typed("split", &[3, 4]))
        .node("Split", "s", &["x", "split"], &["a", "b"], vec![])
        .output("a")
        .output("b")
        .import()
        .expect("import");
    assert_eq!(outputs(&input), outputs(&attr));
    let uneven = Model::new(18)
        .input("x", &[7])
        .node(
            "Split",
            "s",
            &["x"],
            &["a", "b", "c"],
            vec![attr_int("num_outputs", 3), attr_int("axis", -1)],
        )
        .output("a")
        .output("b")
        .output("c")
        .import()
        .expect("import");
    assert_eq!(
        outputs(&uneven),
        [vec![0.0, 1.0, 2.0], vec![3.0, 4.0, 5.0], vec![6.0]]
    );
    let e = error_text(
        Model::new(11)
            .input("x", &[7])
            .node("Split", "halves", &["x"], &["a", "b"], vec![])
            .output("a")
            .output("b")
            .import(),
        "onnx-bad-model",
    );
    assert!(e.contains("halves") && e.contains("equal parts"), "{e}");
    let e = error_text(
        Model::new(13)
            .input("x", &[7])
            .init(i64_typed("split", &[3, 3]))
            .node("Split", "s", &["x", "split"], &["a", "b"], vec![])
            .output("a")
            .output("b")
            .import(),
        "onnx-bad-model",
    );
    assert!(e.contains("does not sum to the axis size 7"), "{e}");
}

#[test]
fn a_split_shape_vector_folds_into_the_reshape() {
    // Shape [2, 3, 4] split into [2] and [3, 4]; Concat(batch, [12]) reshapes x
    let m = Model::new(13)
        .input("x", &[2, 3, 4])
        .init(i64_typed("split", &[1, 2]))
        .init(i64_typed("rest", &[12]))
        .node("Shape", "shape", &["x"], &["s"], vec![])
        .node("Split", "parts", &["s", "split"], &["b", "hw"], vec![])
        .node(
            "Concat",
            "cat",
            &["b", "rest"],
            &["t"],
            vec![attr_int("axis", 0)],
        )
        .node("Reshape", "r", &["x", "t"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    assert_eq!(ops(&m), [&Op::Reshape { shape: vec![2, 12] }]);
}
