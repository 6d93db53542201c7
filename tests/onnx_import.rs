//! ONNX import on small models built here with the protobuf types: opset rules, attribute
//! handling, folding, locations, snapshots of the imported IR, and every kind of bad
//! input (each an error naming the node, op and opset — never a panic).

mod common;
mod jit_util;
mod onnx_build;

use onnx_build::*;

use smelt::ir::op::{Conv2dAttrs, ConvTranspose2dAttrs, UnaryOp};
use smelt::ir::text::{print, PrintOptions};
use smelt::ir::{Location, Module, Op, Tensor, F32};
use smelt::onnx::proto::{NodeProto, StringStringEntryProto, TensorProto};
use smelt::onnx::{import, ImportOptions};

// The model builder is tests/onnx_build.

fn conv_attrs(module: &Module) -> Conv2dAttrs {
    module.funcs[0]
        .insts
        .iter()
        .find_map(|i| match &i.op {
            Op::Conv2d(a) => Some(a.clone()),
            _ => None,
        })
        .expect("a conv2d")
}

// ---------------------------------------------------------------------------------------
// Operator semantics.

#[test]
fn auto_pad_same_upper_and_lower_put_the_odd_pad_at_opposite_ends() {
    // 2x2 kernel, stride 1 on 5x5: output 5x5 needs one row and column of padding.
    for (mode, pads) in [("SAME_UPPER", [0, 0, 1, 1]), ("SAME_LOWER", [1, 1, 0, 0])] {
        let m = Model::new(13)
            .input("x", &[1, 1, 5, 5])
            .init(f32_raw("w", &[1, 1, 2, 2], &[1.0; 4]))
            .node(
                "Conv",
                "c",
                &["x", "w"],
                &["y"],
                vec![attr_string("auto_pad", mode)],
            )
            .output("y")
            .import()
            .expect("import");
        assert_eq!(conv_attrs(&m).pads, pads, "{mode}");
        assert_eq!(m.funcs[0].results.len(), 1);
    }
    // stride 2, 3x3 kernel on 6 wide: out 3, total pad (3-1)*2+3-6 = 1
    let m = Model::new(13)
        .input("x", &[1, 1, 6, 6])
        .init(f32_raw("w", &[1, 1, 3, 3], &[1.0; 9]))
        .node(
            "Conv",
            "c",
            &["x", "w"],
            &["y"],
            vec![
                attr_string("auto_pad", "SAME_UPPER"),
                attr_ints("strides", &[2, 2]),
            ],
        )
        .output("y")
        .import()
        .expect("import");
    assert_eq!(conv_attrs(&m).pads, [0, 0, 1, 1]);
}

fn conv_transpose_attrs(module: &Module) -> ConvTranspose2dAttrs {
    module.funcs[0]
        .insts
        .iter()
        .find_map(|i| match &i.op {
            Op::ConvTranspose2d(a) => Some(a.clone()),
            _ => None,
        })
        .expect("a conv_transpose2d")
}

/// A ConvTranspose of a `[1, 2, 5, 5]` input by `[2, 3, 3, 3]` weights with `attrs`.
fn conv_transpose_model(name: &str, attrs: Vec<smelt::onnx::proto::AttributeProto>) -> Model {
    Model::new(13)
        .input("x", &[1, 2, 5, 5])
        .init(f32_raw("w", &[2, 3, 3, 3], &[0.5; 54]))
        .node("ConvTranspose", name, &["x", "w"], &["y"], attrs)
        .output("y")
}

#[test]
fn conv_transpose_resolves_auto_pad_and_output_shape_into_pads_and_output_padding() {
    // stride 2, 3 taps on 5: the taps reach 2 * 4 + 3 = 11 positions; SAME wants 10,
    // so one is cropped, at the end for SAME_UPPER and at the start for SAME_LOWER
    for (mode, pads) in [("SAME_UPPER", [0, 0, 1, 1]), ("SAME_LOWER", [1, 1, 0, 0])] {
        let m = conv_transpose_model(
            "ct",
            vec![attr_string("auto_pad", mode), attr_ints("strides", &[2, 2])],
        )
        .import()
        .expect("import");
        let a = conv_transpose_attrs(&m);
        assert_eq!((a.pads, a.output_padding), (pads, [0, 0]), "{mode}");
        assert_eq!(
            m.funcs[0].type_of(m.funcs[0].results[0].value).dims,
            [1, 3, 10, 10],
            "{mode}"
        );
    }
    // output_shape one longer than the taps reach: no pads, one row of output padding
    let m = conv_transpose_model(
        "ct",
        vec![
            attr_ints("strides", &[2, 2]),
            attr_ints("output_shape", &[12, 11]),
        ],
    )
    .import()
    .expect("import");
    let a = conv_transpose_attrs(&m);
    assert_eq!((a.pads, a.output_padding), ([0, 0, 0, 0], [1, 0]));
    assert_eq!(
        m.funcs[0].type_of(m.funcs[0].results[0].value).dims,
        [1, 3, 12, 11]
    );
}

#[test]
fn conv_transpose_bad_attributes_name_the_node() {
    // the output must come from these strides: at most stride - 1 past the taps' reach
    let too_large = conv_transpose_model(
        "up1",
        vec![
            attr_ints("strides", &[2, 2]),
            attr_ints("output_shape", &[20, 20]),
        ],
    )
    .import();
    let text = error_text(too_large, "onnx-bad-attribute");
    assert!(
        text.contains("ConvTranspose node 'up1'") && text.contains("'output_shape'"),
        "{text}"
    );
    let group = conv_transpose_model("up2", vec![attr_int("group", 3)]).import();
    let text = error_text(group, "onnx-bad-attribute");
    assert!(
        text.contains("ConvTranspose node 'up2'") && text.contains("'group'"),
        "{text}"
    );
    let kernel = conv_transpose_model("up3", vec![attr_ints("kernel_shape", &[2, 2])]).import();
    let text = error_text(kernel, "onnx-bad-attribute");
    assert!(
        text.contains("ConvTranspose node 'up3'") && text.contains("'kernel_shape'"),
        "{text}"
    );
    let cropped = conv_transpose_model("up4", vec![attr_ints("pads", &[4, 0, 3, 0])]).import();
    let text = error_text(cropped, "onnx-bad-attribute");
    assert!(
        text.contains("ConvTranspose node 'up4'") && text.contains("'pads'"),
        "{text}"
    );
    let rows = Model::new(13)
        .input("x", &[1, 2, 5, 5])
        .init(f32_raw("w", &[3, 2, 3, 3], &[0.5; 54]))
        .node("ConvTranspose", "up5", &["x", "w"], &["y"], vec![])
        .output("y")
        .import();
    let text = error_text(rows, "onnx-bad-model");
    assert!(
        text.contains("ConvTranspose node 'up5'") && text.contains("one row per input channel"),
        "{text}"
    );
}

#[test]
fn pow_of_negative_bases_follows_c_pow_in_the_interpreter_and_the_jit() {
    let x = [
        -2.0f32,
        -2.0,
        -2.0,
        -0.5,
        0.0,
        0.0,
        3.0,
        f32::NAN,
        -3.0,
        2.0,
    ];
    let y = [3.0f32, 2.0, 0.5, -3.0, 0.0, 2.0, 1.5, 0.0, 1e30, -0.5];
    let want: Vec<f32> = x.iter().zip(&y).map(|(&a, &b)| a.powf(b)).collect();
    // the exponent as a run-time input and as a constant (folded masks)
    let run_time = Model::new(13)
        .input("x", &[10])
        .input("e", &[10])
        .node("Pow", "p", &["x", "e"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    let constant = Model::new(13)
        .input("x", &[10])
        .init(f32_raw("e", &[10], &y))
        .node("Pow", "p", &["x", "e"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    let xt = Tensor::new(vec![10], x.to_vec()).expect("x");
    let et = Tensor::new(vec![10], y.to_vec()).expect("e");
    for (m, inputs) in [(&run_time, vec![xt.clone(), et]), (&constant, vec![xt])] {
        let mut outs = vec![run(m, &inputs)];
        for kernels in jit_util::kernel_choices() {
            let o = smelt::CompileOptions {
                kernels,
                ..jit_util::opts()
            };
            let exe = smelt::Executable::compile(m, None, &o).expect("compile");
            outs.push(exe.run(&inputs).expect("run"));
        }
        for got in outs {
            for (i, (&g, &w)) in got[0].f32s().iter().zip(&want).enumerate() {
                let same = g == w || (g.is_nan() && w.is_nan()) || (g - w).abs() <= 1e-6 * w.abs();
                assert!(same, "pow({}, {}) = {g}, want {w}", x[i], y[i]);
            }
        }
    }
}

#[test]
fn conv_keeps_asymmetric_pads_dilations_and_groups() {
    let m = Model::new(11)
        .input("x", &[1, 4, 9, 9])
        .init(f32_raw("w", &[4, 2, 3, 3], &[0.5; 72]))
        .init(f32_raw("b", &[4], &[1.0, 2.0, 3.0, 4.0]))
        .node(
            "Conv",
            "grouped",
            &["x", "w", "b"],
            &["y"],
            vec![
                attr_ints("pads", &[1, 0, 2, 1]),
                attr_ints("dilations", &[2, 1]),
                attr_int("group", 2),
                attr_ints("strides", &[1, 2]),
            ],
        )
        .output("y")
        .import()
        .expect("import");
    let want = Conv2dAttrs {
        strides: [1, 2],
        pads: [1, 0, 2, 1],
        dilations: [2, 1],
        groups: 2,
        ..Conv2dAttrs::default()
    };
    assert_eq!(conv_attrs(&m), want);
    let conv = m.funcs[0]
        .insts
        .iter()
        .find(|i| i.op.name() == "conv2d")
        .expect("conv");
    assert_eq!(conv.operands.len(), 3, "bias is kept");
    assert_eq!(conv.loc, Location::Name("grouped".into()));
}

#[test]
fn softmax_before_opset_13_normalizes_the_flattened_tail() {
    let x: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
    let input = Tensor::new([2, 3, 4], x.clone()).expect("tensor");
    for (opset, group) in [(11, 12), (13, 4)] {
        let m = Model::new(opset)
            .input("x", &[2, 3, 4])
            .node(
                "Softmax",
                "sm",
                &["x"],
                &["y"],
                vec![attr_int("axis", if opset == 11 { 1 } else { -1 })],
            )
            .output("y")
            .import()
            .expect("import");
        let y = &run(&m, std::slice::from_ref(&input))[0];
        // expected: softmax over consecutive groups of `group` elements
        for (chunk_x, chunk_y) in x.chunks(group).zip(y.f32s().chunks(group)) {
            let max = chunk_x.iter().fold(f64::MIN, |m, &v| m.max(v as f64));
            let sum: f64 = chunk_x.iter().map(|&v| (v as f64 - max).exp()).sum();
            for (&a, &b) in chunk_x.iter().zip(chunk_y) {
                let want = (a as f64 - max).exp() / sum;
                assert!(
                    (b as f64 - want).abs() < 1e-6,
                    "opset {opset}: {b} vs {want}"
                );
            }
        }
    }
}

#[test]
fn clip_reads_bounds_from_attributes_before_opset_11_and_from_inputs_after() {
    let old = Model::new(6)
        .input("x", &[4])
        .node(
            "Clip",
            "c",
            &["x"],
            &["y"],
            vec![attr_float("min", -1.0), attr_float("max", 2.0)],
        )
        .output("y")
        .import()
        .expect("import");
    let new = Model::new(13)
        .input("x", &[4])
        .init(f32_raw("lo", &[], &[-1.0]))
        .init(f32_raw("hi", &[], &[2.0]))
        .node("Clip", "c", &["x", "lo", "hi"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    let want = Op::Unary(UnaryOp::Clip {
        min: F32(-1.0),
        max: F32(2.0),
    });
    for m in [&old, &new] {
        assert!(m.funcs[0].insts.iter().any(|i| i.op == want));
        let y = &run(
            m,
            &[Tensor::new([4], vec![-3.0, 0.5, 1.5, 9.0]).expect("t")],
        )[0];
        assert_eq!(y.data, vec![-1.0, 0.5, 1.5, 2.0]);
    }
}

#[test]
fn typed_and_raw_initializers_hold_the_same_values() {
    let values = [1.5f32, -2.0, 0.25, 8.0];
    let mut outputs = Vec::new();
    for t in [f32_raw("b", &[4], &values), f32_typed("b", &[4], &values)] {
        let m = Model::new(13)
            .input("x", &[4])
            .init(t)
            .node("Add", "add", &["x", "b"], &["y"], vec![])
            .output("y")
            .import()
            .expect("import");
        outputs.push(
            run(&m, &[Tensor::new([4], vec![0.0; 4]).expect("t")])[0]
                .data
                .clone(),
        );
    }
    assert_eq!(outputs[0], values);
    assert_eq!(outputs[1], values);
}

#[test]
fn reshape_resolves_zero_and_minus_one_and_identity_dropout_vanish() {
    let m = Model::new(13)
        .input("x", &[2, 3, 4])
        .init(i64_typed("shape", &[0, -1]))
        .node("Identity", "id", &["x"], &["a"], vec![])
        .node("Dropout", "drop", &["a"], &["b"], vec![])
        .node("Reshape", "r", &["b", "shape"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    assert_eq!(ops(&m), [&Op::Reshape { shape: vec![2, 12] }]);
}

#[test]
fn nodes_out_of_order_are_sorted_topologically() {
    let m = Model::new(13)
        .input("x", &[3])
        .node("Sigmoid", "second", &["a"], &["y"], vec![])
        .node("Relu", "first", &["x"], &["a"], vec![])
        .output("y")
        .import()
        .expect("import");
    let locs: Vec<&Location> = m.funcs[0].insts.iter().map(|i| &i.loc).collect();
    assert_eq!(
        locs,
        [
            &Location::Name("first".into()),
            &Location::Name("second".into())
        ]
    );
}

#[test]
fn pinned_shape_replaces_dynamic_dims() {
    let model = Model::new(13)
        .input_dims("x", 1, &[Dim::Param("batch"), Dim::Fixed(3)])
        .node("Relu", "r", &["x"], &["y"], vec![])
        .output("y");
    let opts = ImportOptions::default().with_shape("x", [5, 3]);
    let m = import(&model.bytes(), &opts).expect("import");
    assert_eq!(m.funcs[0].params[0].ty.dims, vec![5, 3]);
    // a pinned shape must agree with the static dims
    let bad = ImportOptions::default().with_shape("x", [5, 4]);
    let text = error_text(import(&model.bytes(), &bad), "onnx-bad-option");
    assert!(
        text.contains("'x'") && text.contains("[batch, 3]"),
        "{text}"
    );
    let unknown = ImportOptions::default().with_shape("nope", [1]);
    let text = error_text(import(&model.bytes(), &unknown), "onnx-bad-option");
    assert!(text.contains("'nope'"), "{text}");
}

// ---------------------------------------------------------------------------------------
// Snapshots of the imported IR.

fn snapshot_cases() -> Vec<(&'static str, Model)> {
    vec![
        (
            "residual_tail",
            Model::new(13)
                .input("x", &[1, 2, 4, 4])
                .input("skip", &[1, 2, 4, 4])
                .init(f32_raw("conv.w", &[2, 2, 3, 3], &[0.1; 36]))
                .init(f32_raw("bn.scale", &[2], &[1.0, 2.0]))
                .init(f32_raw("bn.bias", &[2], &[0.0, 0.5]))
                .init(f32_raw("bn.mean", &[2], &[0.1, 0.2]))
                .init(f32_raw("bn.var", &[2], &[1.0, 4.0]))
                .node(
                    "Conv",
                    "conv",
                    &["x", "conv.w"],
                    &["c"],
                    vec![attr_string("auto_pad", "SAME_UPPER")],
                )
                .node(
                    "BatchNormalization",
                    "bn",
                    &["c", "bn.scale", "bn.bias", "bn.mean", "bn.var"],
                    &["n"],
                    vec![attr_float("epsilon", 1e-3)],
                )
                .node("Add", "add", &["n", "skip"], &["s"], vec![])
                .node("Relu", "relu", &["s"], &["y"], vec![])
                .output("y"),
        ),
        (
            "shape_chain_folded",
            Model::new(13)
                .input("x", &[2, 3, 2, 2])
                .init(i64_typed("zero", &[0]))
                .init(i64_typed("axes", &[0]))
                .init(i64_typed("rest", &[-1]))
                .node("Shape", "shape", &["x"], &["s"], vec![])
                .node(
                    "Gather",
                    "batch",
                    &["s", "zero"],
                    &["b"],
                    vec![attr_int("axis", 0)],
                )
                .node(
                    "Concat",
                    "target",
                    &["b", "rest"],
                    &["t"],
                    vec![attr_int("axis", 0)],
                )
                .node("Reshape", "flatten", &["x", "t"], &["y"], vec![])
                .node("Unsqueeze", "unsq", &["y", "axes"], &["z"], vec![])
                .output("z"),
        ),
        (
            "gelu_tanh",
            Model::new(20)
                .input("x", &[2, 3])
                .node(
                    "Gelu",
                    "gelu",
                    &["x"],
                    &["y"],
                    vec![attr_string("approximate", "tanh")],
                )
                .output("y"),
        ),
        (
            "softmax_opset11",
            Model::new(11)
                .input("x", &[2, 3, 4])
                .node(
                    "Softmax",
                    "softmax",
                    &["x"],
                    &["y"],
                    vec![attr_int("axis", 1)],
                )
                .output("y"),
        ),
        (
            "conv1d_and_pools",
            Model::new(13)
                .input("x", &[1, 2, 9])
                .init(f32_raw("w", &[3, 2, 3], &[0.25; 18]))
                .node(
                    "Conv",
                    "conv1d",
                    &["x", "w"],
                    &["c"],
                    vec![attr_ints("pads", &[1, 1])],
                )
                .node(
                    "MaxPool",
                    "pool",
                    &["c"],
                    &["p", ""],
                    vec![
                        attr_ints("kernel_shape", &[2]),
                        attr_ints("strides", &[2]),
                        attr_int("ceil_mode", 1),
                    ],
                )
                .node(
                    "Flatten",
                    "flat",
                    &["p"],
                    &["y"],
                    vec![attr_int("axis", -2)],
                )
                .output("y"),
        ),
    ]
}

#[test]
fn imported_ir_snapshots() {
    let opts = PrintOptions {
        print_loc: true,
        elide_weights: false,
    };
    for (name, model) in snapshot_cases() {
        let module = model.import().unwrap_or_else(|e| panic!("{name}: {e}"));
        let text = print(&module, &opts);
        common::snapshot_settings("onnx").bind(|| insta::assert_snapshot!(name, text));
    }
}

#[test]
fn every_onnx_snapshot_has_its_case() {
    let names: Vec<&str> = snapshot_cases().iter().map(|(n, _)| *n).collect();
    let dir = common::root().join("snapshots/onnx");
    for entry in std::fs::read_dir(&dir).expect("snapshots/onnx exists") {
        let file = entry
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .into_owned();
        let stem = file.strip_suffix(".snap").unwrap_or(&file);
        assert!(
            names.contains(&stem),
            "orphaned snapshot {file}: no case named {stem}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// Bad inputs: each an error naming what and where.

#[test]
fn unsupported_op_names_node_op_and_opset() {
    let text = error_text(
        Model::new(13)
            .input("x", &[3])
            .node("NonMaxSuppression", "nms_1", &["x"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-unsupported-op",
    );
    assert!(
        text.contains("NonMaxSuppression node 'nms_1', opset 13"),
        "{text}"
    );
    let mut other_domain = Model::new(13).input("x", &[3]).output("y");
    other_domain.graph.node.push(NodeProto {
        op_type: Some("Relu".into()),
        domain: Some("com.microsoft".into()),
        name: Some("ms_relu".into()),
        input: vec!["x".into()],
        output: vec!["y".into()],
        ..Default::default()
    });
    let text = error_text(other_domain.import(), "onnx-unsupported-op");
    assert!(
        text.contains("'ms_relu'") && text.contains("com.microsoft"),
        "{text}"
    );
}

#[test]
fn bad_attributes_are_named() {
    let bad_value = Model::new(13)
        .input("x", &[1, 1, 4, 4])
        .init(f32_raw("w", &[1, 1, 3, 3], &[1.0; 9]))
        .node(
            "Conv",
            "conv_a",
            &["x", "w"],
            &["y"],
            vec![attr_string("auto_pad", "SOMETIMES")],
        )
        .output("y")
        .import();
    let text = error_text(bad_value, "onnx-bad-attribute");
    assert!(
        text.contains("Conv node 'conv_a', opset 13") && text.contains("auto_pad"),
        "{text}"
    );

    let huge_pads = Model::new(13)
        .input("x", &[1, 1, 4, 4])
        .init(f32_raw("w", &[1, 1, 3, 3], &[1.0; 9]))
        .node(
            "Conv",
            "conv_p",
            &["x", "w"],
            &["y"],
            vec![attr_ints("pads", &[0, 0, i64::MAX, 0])],
        )
        .output("y")
        .import();
    let text = error_text(huge_pads, "onnx-bad-attribute");
    assert!(
        text.contains("Conv node 'conv_p'") && text.contains("'pads'"),
        "{text}"
    );

    let wrong_type = Model::new(13)
        .input("x", &[3])
        .node(
            "LeakyRelu",
            "lr",
            &["x"],
            &["y"],
            vec![attr_int("alpha", 2)],
        )
        .output("y")
        .import();
    let text = error_text(wrong_type, "onnx-bad-attribute");
    assert!(text.contains("'alpha' must be FLOAT, got INT"), "{text}");

    let unknown = Model::new(13)
        .input("x", &[3])
        .node("Relu", "r", &["x"], &["y"], vec![attr_int("fast", 1)])
        .output("y")
        .import();
    let text = error_text(unknown, "onnx-unsupported-attribute");
    assert!(
        text.contains("Relu node 'r'") && text.contains("'fast'"),
        "{text}"
    );

    let spatial = Model::new(7)
        .input("x", &[1, 2, 3, 3])
        .init(f32_raw("s", &[2], &[1.0; 2]))
        .node(
            "BatchNormalization",
            "bn0",
            &["x", "s", "s", "s", "s"],
            &["y"],
            vec![attr_int("spatial", 0)],
        )
        .output("y")
        .import();
    let text = error_text(spatial, "onnx-unsupported-attribute");
    assert!(
        text.contains("BatchNormalization node 'bn0', opset 7") && text.contains("spatial = 0"),
        "{text}"
    );
}

#[test]
fn dynamic_dims_without_override_name_input_and_dim() {
    let text = error_text(
        Model::new(13)
            .input_dims(
                "images",
                1,
                &[Dim::Fixed(1), Dim::Param("height"), Dim::Fixed(4)],
            )
            .node("Relu", "r", &["images"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-dynamic-shape",
    );
    assert!(
        text.contains("input 'images' dimension 1 is dynamic ('height'"),
        "{text}"
    );
    // the Rust API's spelling of the pin (the CLI and C spellings: tests/onnx_quirks.rs)
    assert!(
        text.contains("ImportOptions::default().with_shape(\"images\", [1, D1, 4])"),
        "{text}"
    );
}

#[test]
fn external_data_in_bytes_is_rejected_naming_the_initializer() {
    let external = TensorProto {
        name: Some("big_weight".into()),
        dims: vec![4],
        data_type: Some(1),
        data_location: Some(1),
        external_data: vec![StringStringEntryProto {
            key: Some("location".into()),
            value: Some("weights.bin".into()),
        }],
        ..Default::default()
    };
    let text = error_text(
        Model::new(13)
            .input("x", &[4])
            .init(external)
            .node("Add", "add", &["x", "big_weight"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-external-data",
    );
    assert!(
        text.contains("'big_weight'")
            && text.contains("weights.bin")
            && text.contains("import_file"),
        "{text}"
    );
}

#[test]
fn truncated_random_and_empty_bytes_are_errors_not_panics() {
    let good = Model::new(13)
        .input("x", &[1, 1, 4, 4])
        .init(f32_raw("w", &[1, 1, 3, 3], &[1.0; 9]))
        .node(
            "Conv",
            "c",
            &["x", "w"],
            &["y"],
            vec![attr_ints("pads", &[1, 1, 1, 1])],
        )
        .output("y")
        .bytes();
    assert!(import(&good, &ImportOptions::default()).is_ok());
    let mut failures = 0;
    for len in 0..good.len() {
        // Some prefixes are valid protobuf that describe an incomplete model; all must
        // come back as values.
        if import(&good[..len], &ImportOptions::default()).is_err() {
            failures += 1;
        }
    }
    assert!(
        failures > good.len() / 2,
        "only {failures} of {} prefixes failed",
        good.len()
    );
    let text = error_text(
        import(&good[..good.len() - 3], &ImportOptions::default()),
        "onnx-decode",
    );
    assert!(text.contains("truncated"), "{text}");
    let text = error_text(import(&[], &ImportOptions::default()), "onnx-decode");
    assert!(text.contains("empty"), "{text}");
    let mut state = 0x1234_5678_9abc_def0u64;
    for round in 0..200 {
        let noise: Vec<u8> = (0..64 + round)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        assert!(import(&noise, &ImportOptions::default()).is_err());
    }
}

#[test]
fn missing_initializer_names_node_and_tensor() {
    let text = error_text(
        Model::new(13)
            .input("x", &[1, 1, 4, 4])
            .node("Conv", "conv_no_w", &["x", "conv.weight"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-missing-input",
    );
    assert!(
        text.contains("Conv node 'conv_no_w'") && text.contains("'conv.weight'"),
        "{text}"
    );
}

#[test]
fn graph_cycle_names_the_nodes() {
    let text = error_text(
        Model::new(13)
            .input("x", &[3])
            .node("Add", "loop_a", &["x", "b"], &["a"], vec![])
            .node("Relu", "loop_b", &["a"], &["b"], vec![])
            .output("b")
            .import(),
        "onnx-cycle",
    );
    assert!(
        text.contains("'loop_a' (Add)") && text.contains("'loop_b' (Relu)"),
        "{text}"
    );
}

#[test]
fn used_extra_output_names_its_producer() {
    let text = error_text(
        Model::new(13)
            .input("x", &[1, 1, 4, 4])
            .node(
                "MaxPool",
                "pool1",
                &["x"],
                &["y", "idx"],
                vec![attr_ints("kernel_shape", &[2, 2])],
            )
            .node("Relu", "use_idx", &["idx"], &["z"], vec![])
            .output("z")
            .import(),
        "onnx-unsupported-output",
    );
    assert!(
        text.contains("Relu node 'use_idx'")
            && text.contains("Indices output of MaxPool node 'pool1'"),
        "{text}"
    );
}

#[test]
fn opsets_outside_the_known_range_and_old_op_versions_are_rejected() {
    let model = |opset| {
        Model::new(opset)
            .input("x", &[3])
            .node("Add", "add_old", &["x", "x"], &["y"], vec![])
            .output("y")
    };
    let text = error_text(model(30).import(), "onnx-unsupported-opset");
    assert!(text.contains("opset 30"), "{text}");
    let text = error_text(model(6).import(), "onnx-unsupported-opset");
    assert!(
        text.contains("Add node 'add_old', opset 6") && text.contains("version 6"),
        "{text}"
    );
    let text = error_text(
        Model::new(13)
            .input("x", &[3])
            .node("Gelu", "g", &["x"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-unsupported-opset",
    );
    assert!(
        text.contains("Gelu node 'g', opset 13") && text.contains("before opset 20"),
        "{text}"
    );
}

#[test]
fn tensors_of_the_wrong_element_type_are_errors_naming_the_node() {
    // int64 is a run-time type, but relu computes on float32 only
    let text = error_text(
        Model::new(13)
            .input_dims("ids", 7, &fixed(&[3]))
            .node("Relu", "r", &["ids"], &["y"], vec![])
            .output("y")
            .import(),
        "type-mismatch",
    );
    assert!(
        text.contains("Relu node 'r'") && text.contains("operand 0 of 'relu' must be f32, got i64"),
        "{text}"
    );
    // a float32 times an int64 constant: ONNX requires one type, and nothing is converted
    let text = error_text(
        Model::new(13)
            .input("x", &[3])
            .init(i64_typed("k", &[1, 2, 3]))
            .node("Mul", "scale", &["x", "k"], &["y"], vec![])
            .output("y")
            .import(),
        "type-mismatch",
    );
    assert!(
        text.contains("Mul node 'scale'") && text.contains("got f32 and i64"),
        "{text}"
    );
    // an int8 node computes in int32, and its error says so
    let text = error_text(
        Model::new(14)
            .input_dims("small", 3, &fixed(&[3]))
            .node("Relu", "r", &["small"], &["y"], vec![])
            .output("y")
            .import(),
        "type-mismatch",
    );
    assert!(
        text.contains("Relu node 'r'")
            && text.contains("must be f32, got i32")
            && text.contains("computes int8 nodes in int32"),
        "{text}"
    );
    // a uint32 input is no run-time type
    let text = error_text(
        Model::new(13)
            .input_dims("wide", 12, &fixed(&[3]))
            .node("Relu", "r", &["wide"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-unsupported-dtype",
    );
    assert!(
        text.contains("input 'wide' has element type uint32"),
        "{text}"
    );
}

#[test]
fn type_errors_from_the_op_table_name_the_node() {
    let text = error_text(
        Model::new(13)
            .input("a", &[2, 3])
            .input("b", &[4, 5])
            .node("MatMul", "mm", &["a", "b"], &["y"], vec![])
            .output("y")
            .import(),
        "type-mismatch",
    );
    assert!(text.contains("MatMul node 'mm', opset 13"), "{text}");
}

#[test]
fn slice_reads_attributes_before_opset_10_and_inputs_after() {
    // x[1:, ::-2] of a 3x5 matrix, written both ways (ends far out of range are clamped)
    let old = Model::new(9)
        .input("x", &[3, 5])
        .node(
            "Slice",
            "s",
            &["x"],
            &["y"],
            vec![
                attr_ints("starts", &[1]),
                attr_ints("ends", &[1000]),
                attr_ints("axes", &[0]),
            ],
        )
        .node("Neg", "n", &["y"], &["z"], vec![])
        .output("z")
        .import()
        .expect("import");
    let new = Model::new(13)
        .input("x", &[3, 5])
        .init(i64_typed("starts", &[1, -1]))
        .init(i64_typed("ends", &[i64::MAX, i64::MIN]))
        .init(i64_typed("axes", &[0, -1]))
        .init(i64_typed("steps", &[1, -2]))
        .node(
            "Slice",
            "s",
            &["x", "starts", "ends", "axes", "steps"],
            &["y"],
            vec![],
        )
        .node("Neg", "n", &["y"], &["z"], vec![])
        .output("z")
        .import()
        .expect("import");
    let x = Tensor::new([3, 5], (0..15).map(|v| v as f32).collect()).expect("t");
    let old_y = &run(&old, std::slice::from_ref(&x))[0];
    assert_eq!(old_y.dims(), [2, 5]);
    assert_eq!(old_y.data, (5..15).map(|v| -(v as f32)).collect::<Vec<_>>());
    let new_y = &run(&new, std::slice::from_ref(&x))[0];
    assert_eq!(new_y.dims(), [2, 3]);
    assert_eq!(new_y.data, [-9.0, -7.0, -5.0, -14.0, -12.0, -10.0]);
}

#[test]
fn shape_slice_concat_reshape_folds_to_one_reshape() {
    let m = Model::new(13)
        .input("x", &[2, 3, 4])
        .init(i64_typed("zero", &[0]))
        .init(i64_typed("one", &[1]))
        .init(i64_typed("rest", &[12]))
        .node("Shape", "shape", &["x"], &["s"], vec![])
        .node("Slice", "batch", &["s", "zero", "one"], &["b"], vec![])
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

#[test]
fn slice_with_run_time_starts_or_step_zero_is_an_error_naming_the_node() {
    let e = error_text(
        Model::new(13)
            .input("x", &[4])
            .init(i64_typed("ends", &[3]))
            .node("Relu", "r", &["x"], &["starts"], vec![])
            .node("Slice", "window", &["x", "starts", "ends"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-dynamic-shape",
    );
    assert!(e.contains("window") && e.contains("starts"), "{e}");
    let e = error_text(
        Model::new(13)
            .input("x", &[4])
            .init(i64_typed("starts", &[0]))
            .init(i64_typed("ends", &[3]))
            .init(i64_typed("axes", &[0]))
            .init(i64_typed("steps", &[0]))
            .node(
                "Slice",
                "window",
                &["x", "starts", "ends", "axes", "steps"],
                &["y"],
                vec![],
            )
            .output("y")
            .import(),
        "onnx-bad-model",
    );
    assert!(e.contains("window") && e.contains("step 0"), "{e}");
}

#[test]
fn expand_broadcasts_both_ways_and_tile_folds_on_constants() {
    // Expand's result is the broadcast of input and shape: [3, 1] with [2, 1, 4] -> [2, 3, 4]
    let m = Model::new(13)
        .input("x", &[3, 1])
        .init(i64_typed("shape", &[2, 1, 4]))
        .node("Expand", "e", &["x", "shape"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    let y = &run(&m, &[Tensor::new([3, 1], vec![1.0, 2.0, 3.0]).expect("t")])[0];
    assert_eq!(y.dims(), [2, 3, 4]);
    assert_eq!(&y.f32s()[..8], [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]);
    // a tiled constant shape vector folds into the reshape: [2, 6] tiled to [2, 6, 2, 6]
    let m = Model::new(13)
        .input("x", &[2, 6, 2, 6])
        .init(i64_typed("v", &[2, 6]))
        .init(i64_typed("reps", &[2]))
        .node("Tile", "t", &["v", "reps"], &["target"], vec![])
        .node("Reshape", "r", &["x", "target"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    assert!(m.funcs[0]
        .insts
        .iter()
        .all(|i| matches!(i.op, Op::Reshape { .. })));
    let e = error_text(
        Model::new(13)
            .input("x", &[3, 2])
            .init(i64_typed("shape", &[3, 4]))
            .node("Expand", "grow", &["x", "shape"], &["y"], vec![])
            .output("y")
            .import(),
        "onnx-bad-model",
    );
    assert!(e.contains("grow") && e.contains("broadcast"), "{e}");
}

/// A graph attribute holding `graph`.
fn attr_graph(
    name: &str,
    graph: smelt::onnx::proto::GraphProto,
) -> smelt::onnx::proto::AttributeProto {
    smelt::onnx::proto::AttributeProto {
        name: Some(name.into()),
        r#type: Some(smelt::onnx::proto::attribute_proto::AttributeType::Graph as i32),
        g: Some(graph),
        ..Default::default()
    }
}

/// A branch body: one node `op(input) -> output`, the output listed as the body's.
fn branch(op: &str, input: &str, output: &str) -> smelt::onnx::proto::GraphProto {
    Model::new(13)
        .node(op, output, &[input], &[output], vec![])
        .output(output)
        .graph
}

/// torch's LRN export tests a shape before squeezing: `If(Equal(Gather(Shape(x), 1), 1))`.
fn shape_test_if(x_dims: &[i64]) -> Model {
    Model::new(13)
        .input("x", x_dims)
        .init(i64_typed("one", &[1]))
        .init(i64_typed("axis", &[1]))
        .node("Shape", "shape", &["x"], &["s"], vec![])
        .node("Gather", "dim1", &["s", "axis"], &["d"], vec![])
        .node("Equal", "is_one", &["d", "one"], &["c"], vec![])
        .node(
            "If",
            "squeeze_if_one",
            &["c"],
            &["y"],
            vec![
                attr_graph("then_branch", branch("Relu", "x", "then_out")),
                attr_graph("else_branch", branch("Neg", "x", "else_out")),
            ],
        )
        .output("y")
}

#[test]
fn an_if_on_a_shape_test_imports_the_branch_it_takes() {
    for (dims, taken) in [(&[2, 1, 3][..], "relu"), (&[2, 4, 3][..], "neg")] {
        let m = shape_test_if(dims).import().expect("imports");
        let names: Vec<&str> = ops(&m).iter().map(|o| o.name()).collect();
        assert_eq!(names, [taken], "{dims:?}");
        let n: usize = dims.iter().product::<i64>() as usize;
        let x = Tensor::new(
            dims.iter().map(|&d| d as usize).collect::<Vec<_>>(),
            (0..n).map(|i| i as f32 - 3.0).collect(),
        )
        .unwrap();
        let y = run(&m, std::slice::from_ref(&x));
        let want: Vec<f32> = x
            .f32s()
            .iter()
            .map(|&v| if taken == "relu" { v.max(0.0) } else { -v })
            .collect();
        assert_eq!(y[0].f32s(), &want[..]);
    }
}

#[test]
fn an_if_on_run_time_data_or_nested_too_deep_is_a_clear_error() {
    let m = Model::new(13)
        .input_dims("c", 9, &fixed(&[]))
        .input("x", &[2])
        .node(
            "If",
            "data_test",
            &["c"],
            &["y"],
            vec![
                attr_graph("then_branch", branch("Relu", "x", "t")),
                attr_graph("else_branch", branch("Neg", "x", "e")),
            ],
        )
        .output("y");
    let e = error_text(m.import(), "onnx-dynamic-shape");
    assert!(e.contains("data_test") && e.contains("condition"), "{e}");
    // 20 Ifs, each the only node of the enclosing then_branch, all on a constant `true`
    // (the protobuf decoder's recursion limit refuses about 32)
    let mut body = branch("Relu", "x", "y0");
    for depth in 1..=20 {
        let out = format!("y{depth}");
        body = Model::new(13)
            .node(
                "If",
                &format!("if{depth}"),
                &["yes"],
                &[&out],
                vec![
                    attr_graph("then_branch", body),
                    attr_graph("else_branch", branch("Neg", "x", &format!("n{depth}"))),
                ],
            )
            .output(&out)
            .graph;
    }
    let mut m = Model::new(13)
        .input("x", &[2])
        .init(smelt::onnx::proto::TensorProto {
            name: Some("yes".into()),
            data_type: Some(9),
            int32_data: vec![1],
            ..Default::default()
        })
        .output("y20");
    m.graph.node = body.node;
    let e = error_text(m.import(), "onnx-too-deep");
    assert!(e.contains("nested more than 16"), "{e}");
}

#[test]
fn gather_nd_with_batch_dims_picks_the_indexed_rows() {
    // data [2, 3, 2]; per batch entry b, indices [[i], [j]] pick rows data[b, i, :]
    let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
    let m = Model::new(13)
        .input("data", &[2, 3, 2])
        .init(smelt::onnx::proto::TensorProto {
            name: Some("idx".into()),
            data_type: Some(7),
            dims: vec![2, 2, 1],
            int64_data: vec![2, -3, 1, 1],
            ..Default::default()
        })
        .node(
            "GatherND",
            "pick",
            &["data", "idx"],
            &["y"],
            vec![attr_int("batch_dims", 1)],
        )
        .output("y");
    let module = m.import().expect("imports");
    let y = run(&module, &[Tensor::new([2, 3, 2], data).unwrap()]);
    assert_eq!(y[0].dims(), [2, 2, 2]);
    // batch 0: rows 2 and 0 (-3 + 3); batch 1: rows 1 and 1
    assert_eq!(y[0].f32s(), [4.0, 5.0, 0.0, 1.0, 8.0, 9.0, 8.0, 9.0]);
    let mut bad = m.clone();
    bad.graph.initializer[0].int64_data[1] = 3;
    let e = error_text(bad.import(), "onnx-bad-model");
    assert!(e.contains("pick") && e.contains("out of range"), "{e}");
}

#[test]
fn a_pool_over_more_axes_whose_extra_windows_are_trivial_is_a_2d_pool() {
    // torch's LocalResponseNorm export: a channel-window sum as a 3-D AveragePool of
    // kernel [3, 1, 1] over [N, 1, C, H, W]
    let dims = [1usize, 1, 4, 2, 3];
    let x: Vec<f32> = (0..24).map(|i| (i * 7 % 11) as f32).collect();
    let m = Model::new(11)
        .input("x", &[1, 1, 4, 2, 3])
        .node(
            "AveragePool",
            "window_sum",
            &["x"],
            &["y"],
            vec![
                attr_ints("kernel_shape", &[3, 1, 1]),
                attr_ints("pads", &[1, 0, 0, 1, 0, 0]),
                attr_int("count_include_pad", 1),
            ],
        )
        .output("y");
    let module = m.import().expect("imports");
    let y = run(&module, &[Tensor::new(dims, x.clone()).unwrap()]);
    assert_eq!(y[0].dims(), dims);
    let at = |c: i64, p: usize| {
        if (0..4).contains(&c) {
            x[c as usize * 6 + p]
        } else {
            0.0
        }
    };
    for c in 0..4i64 {
        for p in 0..6 {
            let want = (at(c - 1, p) + at(c, p) + at(c + 1, p)) / 3.0;
            let got = y[0].f32s()[c as usize * 6 + p];
            assert!((got - want).abs() < 1e-6, "c {c} p {p}: {got} vs {want}");
        }
    }
    // a real 3-D window is refused, naming the node and the window
    let mut m3 = m.clone();
    m3.graph.node[0].attribute[0] = attr_ints("kernel_shape", &[3, 2, 2]);
    m3.graph.node[0].attribute[1] = attr_ints("pads", &[1, 0, 0, 1, 0, 0]);
    let e = error_text(m3.import(), "onnx-unsupported-op");
    assert!(e.contains("window_sum") && e.contains("[3, 2, 2]"), "{e}");
}

/// A Loop body: `y_out = y_in + x` (x from the enclosing graph), the condition passed on
/// (or, with `data_condition`, computed from y), and y again as a scan output.
fn accumulate_body(data_condition: bool) -> smelt::onnx::proto::GraphProto {
    let body = Model::new(13)
        .input_dims("i", 7, &fixed(&[]))
        .input_dims("cond_in", 9, &fixed(&[]))
        .input("y_in", &[2])
        .node("Add", "step", &["y_in", "x"], &["y_out"], vec![])
        .node("Identity", "scan", &["y_out"], &["y_scan"], vec![]);
    let body = if data_condition {
        body.init(f32_typed("limit", &[], &[5.0]))
            .node(
                "ReduceSum",
                "total",
                &["y_out"],
                &["s"],
                vec![attr_int("keepdims", 0)],
            )
            .node("Less", "below", &["s", "limit"], &["cond_out"], vec![])
    } else {
        body.node("Identity", "keep", &["cond_in"], &["cond_out"], vec![])
    };
    body.output("cond_out")
        .output("y_out")
        .output("y_scan")
        .graph
}

fn loop_model(trips: i64, data_condition: bool) -> Model {
    Model::new(13)
        .input("x", &[2])
        .input("y0", &[2])
        .init(i64_typed("trips", &[trips]))
        .init(TensorProto {
            name: Some("go".into()),
            dims: vec![],
            data_type: Some(9),
            int32_data: vec![1],
            ..Default::default()
        })
        .node(
            "Loop",
            "accumulate",
            &["trips", "go", "y0"],
            &["y", "ys"],
            vec![attr_graph("body", accumulate_body(data_condition))],
        )
        .output("y")
        .output("ys")
}

#[test]
fn a_loop_of_constant_trip_count_unrolls_into_its_carried_value_and_stacked_scan() {
    let m = loop_model(3, false).import().expect("imports");
    let x = Tensor::new([2], vec![1.0, -2.0]).unwrap();
    let y0 = Tensor::new([2], vec![10.0, 20.0]).unwrap();
    let out = run(&m, &[x, y0]);
    assert_eq!(out[0].f32s(), &[13.0, 14.0]);
    assert_eq!(out[1].dims(), [3, 2]);
    assert_eq!(out[1].f32s(), &[11.0, 18.0, 12.0, 16.0, 13.0, 14.0]);
}

#[test]
fn a_loop_too_long_to_unroll_or_stopped_by_data_is_refused_by_name() {
    let e = error_text(loop_model(1_000_000, false).import(), "onnx-too-large");
    assert!(e.contains("accumulate") && e.contains("unroll"), "{e}");
    let e = error_text(loop_model(3, true).import(), "onnx-dynamic-shape");
    assert!(e.contains("accumulate") && e.contains("condition"), "{e}");
}

#[test]
fn a_reversed_scan_unrolls_into_a_suffix_sum() {
    // state s += x_t over x read last to first; each step's s is a scan output, written
    // back last to first too, so ys[t] = Σ_{u ≥ t} x[u]
    let body = Model::new(13)
        .input("s_in", &[1])
        .input("x_t", &[1])
        .node("Add", "step", &["s_in", "x_t"], &["s_out"], vec![])
        .node("Identity", "emit", &["s_out"], &["part"], vec![])
        .output("s_out")
        .output("part")
        .graph;
    let m = Model::new(16)
        .input("s0", &[1])
        .input("x", &[4, 1])
        .node(
            "Scan",
            "suffix",
            &["s0", "x"],
            &["s", "ys"],
            vec![
                attr_graph("body", body),
                attr_int("num_scan_inputs", 1),
                attr_ints("scan_input_directions", &[1]),
                attr_ints("scan_output_directions", &[1]),
            ],
        )
        .output("s")
        .output("ys")
        .import()
        .expect("imports");
    let s0 = Tensor::new([1], vec![0.5]).unwrap();
    let x = Tensor::new([4, 1], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
    let out = run(&m, &[s0, x]);
    assert_eq!(out[0].f32s(), &[10.5]);
    assert_eq!(out[1].f32s(), &[10.5, 9.5, 7.5, 4.5]);
}

/// ReduceMean over H and W of a rank-4 f32 input, kept as 1×1 (torch dynamo's
/// adaptive_avg_pool2d in SE blocks), imports as a global average pool, whose kernel
/// reads channel blocks; other axes, or the axes dropped, stay a reduce_mean. Both
/// compute the interpreter's means.
#[test]
fn reduce_mean_over_the_plane_kept_is_a_global_average_pool() {
    let x: Vec<f32> = (0..2 * 3 * 4 * 5)
        .map(|i| (i as f32 * 0.61).sin())
        .collect();
    let input = Tensor::new([2, 3, 4, 5], x.clone()).expect("tensor");
    for (axes, keepdims, pool) in [
        (vec![2, 3], 1, true),
        (vec![-1, -2], 1, true),
        (vec![2, 3], 0, false),
        (vec![1, 2], 1, false),
    ] {
        let m = Model::new(13)
            .input("x", &[2, 3, 4, 5])
            .node(
                "ReduceMean",
                "mean",
                &["x"],
                &["y"],
                vec![attr_ints("axes", &axes), attr_int("keepdims", keepdims)],
            )
            .output("y")
            .import()
            .expect("import");
        let imported = ops(&m);
        assert_eq!(
            imported.iter().any(|op| matches!(op, Op::GlobalAvgPool)),
            pool,
            "axes {axes:?} keepdims {keepdims}: {imported:?}"
        );
        let y = &run(&m, std::slice::from_ref(&input))[0];
        if pool {
            for (plane, &got) in x.chunks(20).zip(y.f32s()) {
                let want = plane.iter().map(|&v| v as f64).sum::<f64>() / 20.0;
                assert!((got as f64 - want).abs() < 1e-6, "{got} vs {want}");
            }
        }
    }
}
