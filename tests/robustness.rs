//! Robustness: resource bounds (absurd shapes are rejected before anything is allocated,
//! in the text form, the ONNX importer and the builder) and numerical hazards (batch
//! norm folded with tiny variances; NaN and ±inf flowing through the interpreter and
//! the JIT alike). Deep graphs are in `robustness_deep.rs`.

use prost::Message;
use smelt::onnx::proto::tensor_shape_proto::{dimension, Dimension};
use smelt::onnx::proto::{
    type_proto, GraphProto, ModelProto, NodeProto, OperatorSetIdProto, TensorProto,
    TensorShapeProto, TypeProto, ValueInfoProto,
};
use smelt::onnx::{import, ImportOptions};
use smelt::{CompileOptions, Executable};
use smelt::{Error, OptimizeOptions};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{Conv2dAttrs, Pool2dAttrs};
use smelt_ir::text::{self, PrintOptions};
use smelt_ir::types::MAX_TENSOR_BYTES;
use smelt_ir::verify::verify_module;
use smelt_ir::weights::random_f32;
use smelt_ir::{interp, BinaryOp, ErrorStats, Module, Op, Tensor, TensorType, UnaryOp, F32};

// ---------------------------------------------------------------------------------------
// Resource bounds: text.

fn first_code(src: &str) -> &'static str {
    match text::parse(src, "bounds.tir") {
        Ok(m) => panic!("accepted:\n{}", text::print(&m, &PrintOptions::default())),
        Err(d) => d.0[0].code,
    }
}

#[test]
fn text_rejects_absurd_weight_shapes_before_filling_them() {
    // A splat or random fill of 2^60 elements would abort on allocation if the size
    // were not checked first; each must be a diagnostic instead.
    for init in [
        "dense<0.0>",
        "random<seed = 1, min = 0.0, max = 1.0>",
        "dense<[1.0]>",
    ] {
        let src = format!(
            "const @w : tensor<1073741824x1073741824xf32> = {init}\n\
             func @f(%x: tensor<2xf32>) -> tensor<2xf32> {{\n  return %x : tensor<2xf32>\n}}\n"
        );
        assert_eq!(first_code(&src), "too-large", "{init}");
    }
}

#[test]
fn text_rejects_types_whose_byte_size_overflows_u64() {
    // 2147483647^3 * 4 overflows u64; the blocked layout pads the storage further.
    for ty in [
        "tensor<2147483647x2147483647x2147483647xf32>",
        "tensor<2147483647x2147483647x2147483647xi64>",
        "tensor<1x2147483647x2147483647x2147483647xf32, nchw8c>",
        "tensor<1x1x1073741824x2xf32, blocked<3,255>>",
    ] {
        let src = format!("func @f(%x: {ty}) -> {ty} {{\n  return %x : {ty}\n}}\n");
        assert_eq!(first_code(&src), "too-large", "{ty}");
    }
}

#[test]
fn text_rejects_results_that_grow_past_the_limit() {
    // Each operand is 2 GiB (allowed); their concatenation is 4 GiB + 4 bytes... twice that.
    let src = "func @f(%x: tensor<536870912xf32>) -> tensor<1073741824xf32> {\n\
               %0 = concat %x, %x, %x {axis = 0} : tensor<1610612736xf32>\n\
               return %0 : tensor<1610612736xf32>\n}\n";
    let code = first_code(src);
    assert!(code == "too-large" || code == "type-mismatch", "got {code}");
}

// ---------------------------------------------------------------------------------------
// Resource bounds: the builder.

#[test]
fn builder_rejects_absurd_constants_and_results() {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", TensorType::f32([1 << 29]));
    let huge = TensorType::f32([1 << 40, 1 << 40]);
    assert!(
        b.constant("w", huge, &[]).is_err(),
        "absurd constant accepted"
    );
    // 3 x 2 GiB = 6 GiB > 4 GiB: the type rule's size check refuses it.
    let err = b
        .op(Op::Concat { axis: 0 }, &[x, x, x])
        .expect_err("6 GiB concat accepted");
    assert!(err.message.contains("too large"), "{err}");
    let err = b
        .op(
            Op::Reshape {
                shape: vec![usize::MAX, 2],
            },
            &[x],
        )
        .expect_err("overflowing reshape accepted");
    assert_eq!(err.code, "type-mismatch");
    b.finish(&[("y", x)]);
}

#[test]
fn builder_params_with_absurd_types_are_caught_before_anything_runs() {
    // The builder records parameter types as given; the verifier, the interpreter and
    // the compiler each refuse them without allocating.
    let huge = TensorType::f32([usize::MAX / 2, 4]);
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", huge.clone());
    assert!(
        b.op(Op::Unary(UnaryOp::Relu), &[x]).is_err(),
        "relu of an absurd type accepted"
    );
    b.finish(&[("y", x)]);
    let diags = verify_module(&m).expect_err("verifier accepted an absurd parameter");
    assert_eq!(diags.0[0].code, "too-large");
    assert!(Tensor::new(huge.dims.clone(), vec![]).is_err());
    let fake_input = Tensor {
        ty: huge,
        data: Vec::<f32>::new().into(),
    };
    assert!(interp::run(&m, &m.funcs[0], &[fake_input]).is_err());
    assert!(Executable::compile(&m, None, &CompileOptions::default()).is_err());
}

// ---------------------------------------------------------------------------------------
// Resource bounds: ONNX.

fn float_input(name: &str, dims: &[i64]) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        r#type: Some(TypeProto {
            value: Some(type_proto::Value::TensorType(type_proto::Tensor {
                elem_type: Some(1),
                shape: Some(TensorShapeProto {
                    dim: dims
                        .iter()
                        .map(|&d| Dimension {
                            value: Some(dimension::Value::DimValue(d)),
                            ..Default::default()
                        })
                        .collect(),
                }),
            })),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn output(name: &str) -> ValueInfoProto {
    ValueInfoProto {
        name: Some(name.into()),
        ..Default::default()
    }
}

fn node(op: &str, inputs: &[&str], out: &str) -> NodeProto {
    NodeProto {
        op_type: Some(op.into()),
        name: Some(format!("{op}_node")),
        input: inputs.iter().map(|s| s.to_string()).collect(),
        output: vec![out.into()],
        ..Default::default()
    }
}

fn i64_tensor(name: &str, values: &[i64]) -> TensorProto {
    TensorProto {
        name: Some(name.into()),
        data_type: Some(7),
        dims: vec![values.len() as i64],
        int64_data: values.to_vec(),
        ..Default::default()
    }
}

fn model(graph: GraphProto) -> Vec<u8> {
    ModelProto {
        ir_version: Some(8),
        opset_import: vec![OperatorSetIdProto {
            domain: Some(String::new()),
            version: Some(13),
        }],
        graph: Some(graph),
        ..Default::default()
    }
    .encode_to_vec()
}

fn onnx_code(bytes: &[u8]) -> String {
    match import(bytes, &ImportOptions::default()) {
        Ok(m) => panic!("accepted:\n{}", text::print(&m, &PrintOptions::default())),
        Err(Error::Onnx(d)) => d.0[0].code.to_string(),
        Err(e) => panic!("not an ONNX diagnostic: {e}"),
    }
}

#[test]
fn onnx_rejects_absurd_shapes_before_allocating() {
    let huge_input = model(GraphProto {
        input: vec![float_input("x", &[1 << 31, 1 << 31, 1 << 31])],
        output: vec![output("x")],
        ..Default::default()
    });
    onnx_code(&huge_input);
    let dataless_initializer = model(GraphProto {
        initializer: vec![TensorProto {
            name: Some("w".into()),
            data_type: Some(1),
            dims: vec![1 << 40, 1 << 20],
            ..Default::default()
        }],
        output: vec![output("w")],
        ..Default::default()
    });
    onnx_code(&dataless_initializer);
    let constant_of_shape = model(GraphProto {
        initializer: vec![i64_tensor("shape", &[1 << 30, 1 << 30])],
        node: vec![node("ConstantOfShape", &["shape"], "y")],
        output: vec![output("y")],
        ..Default::default()
    });
    onnx_code(&constant_of_shape);
    let reshape_to_huge = model(GraphProto {
        input: vec![float_input("x", &[4])],
        initializer: vec![i64_tensor("shape", &[1 << 40, 1 << 40, 0])],
        node: vec![node("Reshape", &["x", "shape"], "y")],
        output: vec![output("y")],
        ..Default::default()
    });
    onnx_code(&reshape_to_huge);
}

#[test]
fn the_size_limit_is_four_gibibytes() {
    // The bound the checks above enforce; a change must be deliberate.
    assert_eq!(MAX_TENSOR_BYTES, 1 << 32);
    assert!(TensorType::f32([1 << 30]).check_size().is_ok());
    assert!(TensorType::f32([(1 << 30) + 1]).check_size().is_err());
}

// ---------------------------------------------------------------------------------------
// Numerical hazards.

fn compile_opts() -> CompileOptions {
    CompileOptions {
        verify: true,
        threads: 1,
        ..CompileOptions::default()
    }
}

/// conv2d → batch_norm with the given variances and epsilon (gamma 1, beta 0.25,
/// mean 0.5): the module, and an input.
fn conv_bn(var: &[f32], epsilon: f32) -> (Module, Tensor) {
    let c = var.len();
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", TensorType::f32([1, 2, 4, 4]));
    let w = b
        .constant(
            "w",
            TensorType::f32([c, 2, 3, 3]),
            &random_f32(1, c * 18, -0.5, 0.5),
        )
        .expect("weight");
    let conv = b
        .op(
            Op::Conv2d(Conv2dAttrs {
                pads: [1; 4],
                ..Conv2dAttrs::default()
            }),
            &[x, w],
        )
        .expect("conv");
    let vec_const = |b: &mut FuncBuilder, name: &str, v: f32| {
        b.constant(name, TensorType::f32([c]), &vec![v; c])
            .expect("bn parameter")
    };
    let g = vec_const(&mut b, "g", 1.0);
    let beta = vec_const(&mut b, "beta", 0.25);
    let mean = vec_const(&mut b, "mean", 0.5);
    let v = b
        .constant("var", TensorType::f32([c]), var)
        .expect("variance");
    let y = b
        .op(
            Op::BatchNorm {
                epsilon: F32(epsilon),
            },
            &[conv, g, beta, mean, v],
        )
        .expect("batch_norm");
    b.finish(&[("y", y)]);
    let input = Tensor::new([1, 2, 4, 4], random_f32(2, 32, -1.0, 1.0)).expect("input");
    (m, input)
}

fn count_ops(m: &Module, name: &str) -> usize {
    m.funcs[0]
        .insts
        .iter()
        .filter(|i| i.op.name() == name)
        .count()
}

#[test]
fn bn_folding_with_tiny_variance_stays_finite_and_exact() {
    // var + eps down to the smallest subnormal: 1/sqrt(1.4e-45) = 2.7e22 still fits f32,
    // but 1/(var + eps) would overflow it — the fold must take the square root in f64.
    for epsilon in [1e-5, 1e-20, 1e-45] {
        let (module, input) = conv_bn(&[0.0, 1e-40, 1e-30, 1e-10], epsilon);
        let want = interp::run(&module, &module.funcs[0], std::slice::from_ref(&input))
            .expect("interpreter on the unfused module");
        let mut folded = module.clone();
        smelt::optimize(&mut folded, &OptimizeOptions::default(), None).expect("optimize");
        assert_eq!(
            count_ops(&folded, "batch_norm"),
            0,
            "epsilon {epsilon:e}: batch norm was not folded:\n{}",
            text::print(&folded, &PrintOptions::default())
        );
        for (_, w) in folded.weights.iter() {
            assert!(
                w.f32s().iter().all(|v| v.is_finite()),
                "epsilon {epsilon:e}: folded weight @{} holds inf or NaN",
                w.name
            );
        }
        let got = interp::run(&folded, &folded.funcs[0], std::slice::from_ref(&input))
            .expect("interpreter on the folded module");
        let exe = Executable::compile(&folded, None, &compile_opts()).expect("compile");
        let jit = exe.run(std::slice::from_ref(&input)).expect("run");
        for (what, out) in [("folded", &got[0]), ("jit", &jit[0])] {
            assert!(
                out.f32s().iter().all(|v| v.is_finite()),
                "epsilon {epsilon:e}: {what} output holds inf or NaN"
            );
            let stats = ErrorStats::between_tensors(out, &want[0]).expect("same shape");
            assert!(
                stats.relative < 1e-4,
                "epsilon {epsilon:e}: {what} relative error {:e}",
                stats.relative
            );
        }
    }
}

/// Values that must flow through every op as the interpreter says.
const SPECIALS: [f32; 8] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    -0.0,
    1e-40,
    1.0,
    -1.0,
    3.5,
];

/// Every unary elementwise op, from the op table's samples (attributes away from their
/// defaults), so a new one is tested here without an edit.
fn every_unary_op() -> Vec<UnaryOp> {
    let all: Vec<UnaryOp> = smelt_ir::op::samples()
        .iter()
        .filter_map(|op| {
            if let Op::Unary(u) = op {
                Some(*u)
            } else {
                None
            }
        })
        .collect();
    assert!(all.contains(&UnaryOp::Relu) && all.iter().any(|u| matches!(u, UnaryOp::Clip { .. })));
    all
}

/// Runs `m` in the interpreter and the JIT; describes every element where they differ
/// (NaN matches only NaN, infinities match only themselves).
fn jit_vs_interp(what: &str, m: &Module, inputs: &[Tensor]) -> Vec<String> {
    let want = match interp::run(m, &m.funcs[0], inputs) {
        Ok(w) => w,
        Err(d) => return vec![format!("{what}: interpreter failed: {d}")],
    };
    let exe = match Executable::compile(m, None, &compile_opts()) {
        Ok(e) => e,
        Err(e) => return vec![format!("{what}: compile failed: {e}")],
    };
    let got = match exe.run(inputs) {
        Ok(g) => g,
        Err(e) => return vec![format!("{what}: run failed: {e}")],
    };
    let mut bad = Vec::new();
    for (g, w) in got.iter().zip(&want) {
        let (g, w) = (g.f32s_row_major(), w.f32s_row_major());
        for (i, (&a, &b)) in g.iter().zip(&w).enumerate() {
            let same = (a.is_nan() && b.is_nan())
                || a == b
                || (a.is_finite() && b.is_finite() && (a - b).abs() <= 1e-5 * b.abs().max(1.0));
            if !same {
                bad.push(format!("{what}: element {i}: JIT {a:?}, interpreter {b:?}"));
            }
        }
    }
    bad
}

fn unary_module(op: UnaryOp, n: usize) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", TensorType::f32([n]));
    let y = b.op(Op::Unary(op), &[x]).expect("unary");
    b.finish(&[("y", y)]);
    m
}

#[test]
fn interpreter_propagates_nan_through_relu_clip_min_max() {
    // The oracle's documented semantics (ir/src/op/elementwise.rs): NaN propagates.
    assert!(UnaryOp::Relu.eval(f64::NAN).is_nan());
    assert!(UnaryOp::Clip {
        min: F32(0.0),
        max: F32(6.0)
    }
    .eval(f64::NAN)
    .is_nan());
    assert!(BinaryOp::Max.eval(f64::NAN, 1.0).is_nan());
    assert!(BinaryOp::Min.eval(1.0, f64::NAN).is_nan());
    let m = unary_module(UnaryOp::Relu, SPECIALS.len());
    let x = Tensor::new([SPECIALS.len()], SPECIALS.to_vec()).expect("input");
    let y = interp::run(&m, &m.funcs[0], &[x]).expect("interpreter");
    assert!(y[0].f32s()[0].is_nan());
    assert_eq!(y[0].f32s()[1], f32::INFINITY);
    assert_eq!(y[0].f32s()[2], 0.0);
}

#[test]
fn nan_and_inf_flow_through_unary_ops_in_the_jit_as_in_the_interpreter() {
    let x = Tensor::new([SPECIALS.len()], SPECIALS.to_vec()).expect("input");
    let mut bad = Vec::new();
    for op in every_unary_op() {
        bad.extend(jit_vs_interp(
            op.name(),
            &unary_module(op, SPECIALS.len()),
            std::slice::from_ref(&x),
        ));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn nan_and_inf_flow_through_binary_ops_in_the_jit_as_in_the_interpreter() {
    let n = SPECIALS.len();
    // every pair (a, b) of specials
    let a: Vec<f32> = (0..n * n).map(|i| SPECIALS[i / n]).collect();
    let b: Vec<f32> = (0..n * n).map(|i| SPECIALS[i % n]).collect();
    let inputs = [
        Tensor::new([n * n], a).expect("a"),
        Tensor::new([n * n], b).expect("b"),
    ];
    let mut bad = Vec::new();
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::PRelu,
    ] {
        let mut m = Module::default();
        let mut bld = FuncBuilder::new(&mut m, "f");
        let x = bld.param("a", TensorType::f32([n * n]));
        let y = bld.param("b", TensorType::f32([n * n]));
        let z = bld.op(Op::Binary(op), &[x, y]).expect("binary");
        bld.finish(&[("z", z)]);
        bad.extend(jit_vs_interp(op.name(), &m, &inputs));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

fn pool_module(op: Op, dims: [usize; 4]) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", TensorType::f32(dims));
    let y = b.op(op, &[x]).expect("pool");
    b.finish(&[("y", y)]);
    m
}

#[test]
fn nan_and_inf_flow_through_pools_and_softmax_in_the_jit_as_in_the_interpreter() {
    let dims = [1, 2, 2, 4];
    let x = Tensor::new(dims, SPECIALS.iter().chain(&SPECIALS).copied().collect()).expect("x");
    let window = Pool2dAttrs {
        kernel: [2, 2],
        strides: [1, 1],
        pads: [0; 4],
        dilations: [1, 1],
        ceil_mode: false,
        layout: smelt_ir::Layout::RowMajor,
    };
    let mut bad = Vec::new();
    for (what, op) in [
        ("max_pool2d", Op::MaxPool2d(window.clone())),
        (
            "avg_pool2d",
            Op::AvgPool2d {
                pool: window,
                count_include_pad: false,
            },
        ),
        ("global_avg_pool", Op::GlobalAvgPool),
        ("softmax", Op::Softmax { axis: 3 }),
    ] {
        bad.extend(jit_vs_interp(
            what,
            &pool_module(op, dims),
            std::slice::from_ref(&x),
        ));
    }
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn max_pool_windows_entirely_in_padding_agree_in_the_jit_and_the_interpreter() {
    // kernel 1 with pad 1 (allowed: pad < kernel * dilation = 2): the first output row
    // reads only padding. The interpreter documents NaN for such windows.
    let pool = Pool2dAttrs {
        kernel: [1, 1],
        strides: [1, 1],
        pads: [1, 0, 0, 0],
        dilations: [2, 1],
        ceil_mode: false,
        layout: smelt_ir::Layout::RowMajor,
    };
    let dims = [1, 1, 2, 2];
    let x = Tensor::new(dims, vec![1.0, -2.0, 3.0, -4.0]).expect("x");
    let m = pool_module(Op::MaxPool2d(pool), dims);
    let want = interp::run(&m, &m.funcs[0], std::slice::from_ref(&x)).expect("interp");
    assert!(
        want[0].f32s()[0].is_nan(),
        "interpreter: {:?}",
        want[0].data
    );
    let bad = jit_vs_interp("max_pool2d over padding", &m, &[x]);
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

#[test]
fn nan_input_through_a_fused_conv_relu_tail_agrees() {
    let (mut module, mut input) = conv_bn(&[1.0, 0.5], 1e-5);
    input.f32s_mut()[5] = f32::NAN;
    input.f32s_mut()[9] = f32::INFINITY;
    // conv → bn → relu, fused and folded
    let f = &mut module.funcs[0];
    let y = f.results[0].value;
    let ty = f.type_of(y).clone();
    f.insts.push(smelt_ir::Inst {
        op: Op::Unary(UnaryOp::Relu),
        operands: vec![y],
        ty,
        loc: smelt_ir::Location::Unknown,
    });
    let r = f.inst_value(f.insts.len() - 1);
    f.results[0].value = r;
    verify_module(&module).expect("valid");
    let mut fused = module.clone();
    smelt::optimize(&mut fused, &OptimizeOptions::default(), None).expect("optimize");
    assert!(count_ops(&fused, "fused") >= 1, "nothing was fused");
    let mut bad = jit_vs_interp("unfused", &module, std::slice::from_ref(&input));
    bad.extend(jit_vs_interp("fused", &fused, std::slice::from_ref(&input)));
    assert!(bad.is_empty(), "{}", bad.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Regressions found by the fuzzers.

#[test]
fn i64_weights_round_trip_through_the_text_form() {
    // import_onnx fuzzer: an ONNX graph returning a Shape output imports as an i64
    // weight, which printed as f32 bit patterns and did not parse back.
    let src = "const @y : tensor<3xi64> = dense<[3, -4, 9223372036854775807]>\n\
               const @z : tensor<2x2xi64> = dense<7>\n\
               func @main(%x: tensor<2xf32>) -> (y: tensor<3xi64>, z: tensor<2x2xi64>) {\n\
               %0 = const @y : tensor<3xi64>\n\
               %1 = const @z : tensor<2x2xi64>\n\
               return %0, %1 : tensor<3xi64>, tensor<2x2xi64>\n}\n";
    let m = text::parse(src, "i64.tir").unwrap_or_else(|d| panic!("{}", d.render(Some(src))));
    let y = m
        .weights
        .get(m.weights.lookup("y").expect("@y"))
        .expect("data");
    assert_eq!(y.data.as_i64(), &[3, -4, i64::MAX]);
    let z = m
        .weights
        .get(m.weights.lookup("z").expect("@z"))
        .expect("data");
    assert_eq!(z.data.as_i64(), &[7, 7, 7, 7]);
    let printed = text::print(&m, &PrintOptions::default());
    assert!(
        printed.contains("dense<[3, -4, 9223372036854775807]>"),
        "{printed}"
    );
    let again = text::parse(&printed, "printed.tir").expect("printed text parses");
    assert_eq!(text::print(&again, &PrintOptions::default()), printed);
}

#[test]
fn onnx_shape_outputs_round_trip_through_the_text_form() {
    let graph = GraphProto {
        input: vec![float_input("x", &[3, 4, 5])],
        node: vec![node("Shape", &["x"], "y")],
        output: vec![output("y")],
        ..Default::default()
    };
    let m = import(&model(graph), &ImportOptions::default()).expect("imports");
    let printed = text::print(&m, &PrintOptions::default());
    assert!(printed.contains("dense<[3, 4, 5]>"), "{printed}");
    let again = text::parse(&printed, "printed.tir")
        .unwrap_or_else(|d| panic!("{}\n{printed}", d.render(Some(&printed))));
    assert_eq!(text::print(&again, &PrintOptions::default()), printed);
}

#[test]
fn onnx_inputs_and_outputs_need_unique_non_empty_names() {
    // import_onnx fuzzer: an input named "" became a parameter the verifier rejects.
    let empty_input = model(GraphProto {
        input: vec![float_input("", &[2])],
        node: vec![node("Relu", &[""], "y")],
        output: vec![output("y")],
        ..Default::default()
    });
    assert_eq!(onnx_code(&empty_input), "onnx-bad-model");
    let twice = model(GraphProto {
        input: vec![float_input("x", &[2])],
        node: vec![node("Relu", &["x"], "y")],
        output: vec![output("y"), output("y")],
        ..Default::default()
    });
    assert_eq!(onnx_code(&twice), "onnx-bad-model");
    let empty_output = model(GraphProto {
        input: vec![float_input("x", &[2])],
        output: vec![output("")],
        ..Default::default()
    });
    assert_eq!(onnx_code(&empty_output), "onnx-bad-model");
}
