//! The ONNX ops smelt imports as compositions (GatherElements, the losses, Attention)
//! on small models built here: run-time indices and targets checked at run time — an
//! index out of range is an error from the interpreter and from every JIT kernel choice,
//! never a read elsewhere —, constant ones at import, Attention's fully-masked rows as
//! zeros, ArgMax/ArgMin and TopK ties and NaNs, OneHot indices out of range, an exact int64
//! ReduceProd and CumSum, the scatters' reductions over duplicate constant indices,
//! ReverseSequence, BitwiseNot within the element width, an Einsum label broadcast from
//! size 1, AffineGrid's identity grid sampled back by GridSample, and what smelt refuses
//! (scatters at run-time indices, Attention's and the recurrent ops' attributes, lengths
//! beyond the sequence, malformed Einsum equations, GridSample's modes and volumes outside
//! their opset, an AffineGrid theta that does not fit its size) named in the error.

mod common;
mod jit_util;
mod onnx_build;

use onnx_build::*;

use smelt::ir::{Module, Tensor};
use smelt::onnx::proto::TensorProto;

const FLOAT: i32 = 1;
const INT64: i32 = 7;
const BOOL: i32 = 9;

/// The outputs of the interpreter and of each JIT kernel choice, or their errors' text.
fn run_everywhere(m: &Module, inputs: &[Tensor]) -> Vec<Result<Vec<Tensor>, String>> {
    let mut outs = vec![smelt::ir::interp::run(m, &m.funcs[0], inputs).map_err(|e| e.to_string())];
    for kernels in jit_util::kernel_choices() {
        let o = smelt::CompileOptions {
            kernels,
            ..jit_util::opts()
        };
        let exe = smelt::Executable::compile(m, None, &o).expect("compile");
        outs.push(exe.run(inputs).map_err(|e| e.to_string()));
    }
    outs
}

fn gather_elements_model() -> Model {
    Model::new(13)
        .input("data", &[2, 3])
        .input_dims("indices", INT64, &fixed(&[2, 2]))
        .node(
            "GatherElements",
            "pick",
            &["data", "indices"],
            &["y"],
            vec![attr_int("axis", 1)],
        )
        .output("y")
}

#[test]
fn gather_elements_picks_along_the_axis_and_refuses_indices_out_of_range_at_run_time() {
    let m = gather_elements_model().import().expect("import");
    let data: Vec<f32> = (1..=6).map(|v| v as f32).collect();
    let data_t = Tensor::new(vec![2, 3], data.clone()).expect("data");
    let indices = [0i64, -1, 2, 1];
    let want: Vec<f32> = indices
        .iter()
        .enumerate()
        .map(|(p, &i)| data[(p / 2) * 3 + i.rem_euclid(3) as usize])
        .collect();
    let idx = Tensor::typed(vec![2, 2], indices.to_vec()).expect("indices");
    for got in run_everywhere(&m, &[data_t.clone(), idx]) {
        assert_eq!(got.expect("in range")[0].f32s(), want.as_slice());
    }
    // one past the end, and one before the start: errors, never a neighbour's element
    for bad in [3i64, -4] {
        let idx = Tensor::typed(vec![2, 2], vec![0, 0, bad, 0]).expect("indices");
        for got in run_everywhere(&m, &[data_t.clone(), idx]) {
            let e = got.expect_err("an index out of range must fail");
            assert!(e.contains("out of range"), "{e}");
        }
    }
}

#[test]
fn gather_elements_with_constant_indices_out_of_range_is_an_import_error() {
    let m = Model::new(13)
        .input("data", &[2, 3])
        .init(i64_typed("indices", &[0, 5]))
        .node("Reshape", "r", &["indices", "shape"], &["i2"], vec![])
        .init(i64_typed("shape", &[2, 1]))
        .node(
            "GatherElements",
            "pick",
            &["data", "i2"],
            &["y"],
            vec![attr_int("axis", 1)],
        )
        .output("y");
    let e = error_text(m.import(), "onnx-bad-model");
    assert!(
        e.contains("index 5 is out of range for axis 1 of size 3"),
        "{e}"
    );
    assert!(e.contains("pick"), "{e}");
}

fn nll_model(reduction: &str) -> Model {
    Model::new(13)
        .input("log_prob", &[2, 3])
        .input_dims("target", INT64, &fixed(&[2]))
        .node(
            "NegativeLogLikelihoodLoss",
            "loss",
            &["log_prob", "target"],
            &["y"],
            vec![
                attr_string("reduction", reduction),
                attr_int("ignore_index", -1),
            ],
        )
        .output("y")
}

#[test]
fn nll_loss_skips_the_ignored_target_and_refuses_a_class_out_of_range() {
    let x: Vec<f32> = vec![-0.5, -1.5, -2.5, -0.25, -0.75, -1.25];
    let xt = Tensor::new(vec![2, 3], x.clone()).expect("x");
    let target = Tensor::typed(vec![2], vec![2i64, -1]).expect("target");
    // the second target is ignored: its loss is 0 and the mean is over the first alone
    let none = nll_model("none").import().expect("import");
    for got in run_everywhere(&none, &[xt.clone(), target.clone()]) {
        assert_eq!(got.expect("run")[0].f32s(), &[-x[2], 0.0]);
    }
    let mean = nll_model("mean").import().expect("import");
    for got in run_everywhere(&mean, &[xt.clone(), target]) {
        assert_eq!(got.expect("run")[0].f32s(), &[-x[2]]);
    }
    let bad = Tensor::typed(vec![2], vec![3i64, 0]).expect("target");
    for got in run_everywhere(&mean, &[xt, bad]) {
        let e = got.expect_err("a class out of range must fail");
        assert!(e.contains("out of range"), "{e}");
    }
}

fn attention_model(attrs: Vec<smelt::onnx::proto::AttributeProto>) -> Model {
    Model::new(23)
        .input("q", &[1, 1, 2, 2])
        .input("k", &[1, 1, 2, 2])
        .input("v", &[1, 1, 2, 2])
        .input_dims("mask", BOOL, &fixed(&[2, 2]))
        .node("Attention", "attn", &["q", "k", "v", "mask"], &["y"], attrs)
        .output("y")
}

#[test]
fn attention_gives_a_fully_masked_row_zeros_and_a_single_key_its_value() {
    let m = attention_model(vec![]).import().expect("import");
    let q = jit_util::random(&[1, 1, 2, 2], 1);
    let k = jit_util::random(&[1, 1, 2, 2], 2);
    let v = Tensor::new(vec![1, 1, 2, 2], vec![0.5, -1.5, 2.0, 3.0]).expect("v");
    // query 0 sees no key, query 1 only key 0
    let mask = Tensor::typed(vec![2, 2], vec![false, false, true, false]).expect("mask");
    let want = [0.0, 0.0, v.f32s()[0], v.f32s()[1]];
    for got in run_everywhere(&m, &[q.clone(), k.clone(), v.clone(), mask.clone()]) {
        assert_eq!(got.expect("run")[0].f32s(), &want);
    }
}

#[test]
fn attention_refuses_what_smelt_does_not_compute_by_name() {
    let e = error_text(
        attention_model(vec![attr_int("softmax_precision", 10)]).import(),
        "onnx-unsupported-attribute",
    );
    assert!(e.contains("softmax_precision 10"), "{e}");
    let e = error_text(
        attention_model(vec![attr_float("softcap", -1.0)]).import(),
        "onnx-bad-attribute",
    );
    assert!(e.contains("softcap"), "{e}");
    let e = error_text(
        attention_model(vec![attr_int("qk_matmul_output_mode", 4)]).import(),
        "onnx-bad-attribute",
    );
    assert!(e.contains("qk_matmul_output_mode"), "{e}");
    // 3-D inputs without their head counts
    let three_d = Model::new(23)
        .input("q", &[1, 2, 4])
        .input("k", &[1, 2, 4])
        .input("v", &[1, 2, 4])
        .node("Attention", "attn", &["q", "k", "v"], &["y"], vec![])
        .output("y");
    let e = error_text(three_d.import(), "onnx-bad-model");
    assert!(e.contains("q_num_heads"), "{e}");
    // a mask that does not broadcast to the scores
    let wide = Model::new(23)
        .input("q", &[1, 1, 2, 2])
        .input("k", &[1, 1, 2, 2])
        .input("v", &[1, 1, 2, 2])
        .input_dims("mask", FLOAT, &fixed(&[3, 2]))
        .node(
            "Attention",
            "attn",
            &["q", "k", "v", "mask"],
            &["y"],
            vec![],
        )
        .output("y");
    let e = error_text(wide.import(), "onnx-bad-model");
    assert!(e.contains("attn_mask of shape [3, 2]"), "{e}");
}

fn arg_model(op: &str, select_last: i64) -> Model {
    Model::new(13)
        .input("x", &[2, 3])
        .node(
            op,
            "arg",
            &["x"],
            &["y"],
            vec![
                attr_int("axis", 1),
                attr_int("keepdims", 0),
                attr_int("select_last_index", select_last),
            ],
        )
        .output("y")
}

#[test]
fn argmax_and_argmin_pick_the_first_or_last_tie_and_count_nan_as_the_extreme() {
    let nan = f32::NAN;
    let x = Tensor::new(vec![2, 3], vec![3.0, 1.0, 3.0, 2.0, nan, f32::INFINITY]).expect("x");
    let cases = [
        ("ArgMax", 0, [0i64, 1]),
        ("ArgMax", 1, [2, 2]),
        ("ArgMin", 0, [1, 1]),
        ("ArgMin", 1, [1, 1]),
    ];
    for (op, last, want) in cases {
        let m = arg_model(op, last).import().expect("import");
        for got in run_everywhere(&m, std::slice::from_ref(&x)) {
            let got = got.expect("run");
            assert_eq!(got[0].data.as_i64(), Some(&want[..]), "{op} last {last}");
        }
    }
}

#[test]
fn one_hot_wraps_negative_indices_and_leaves_indices_out_of_range_all_off() {
    let m = Model::new(11)
        .input_dims("indices", INT64, &fixed(&[3]))
        .init(i64_typed("depth", &[3]))
        .init(f32_raw("values", &[2], &[-1.0, 5.0]))
        .node(
            "OneHot",
            "hot",
            &["indices", "depth", "values"],
            &["y"],
            vec![],
        )
        .output("y");
    let m = m.import().expect("import");
    let indices = Tensor::typed(vec![3], vec![1i64, -1, 3]).expect("indices");
    let want = [-1.0, 5.0, -1.0, -1.0, -1.0, 5.0, -1.0, -1.0, -1.0];
    for got in run_everywhere(&m, std::slice::from_ref(&indices)) {
        assert_eq!(got.expect("run")[0].f32s(), &want);
    }
}

#[test]
fn reduce_prod_of_int64_is_exact_above_two_to_the_24() {
    let m = Model::new(13)
        .input_dims("x", INT64, &fixed(&[2, 5]))
        .node(
            "ReduceProd",
            "prod",
            &["x"],
            &["y"],
            vec![attr_ints("axes", &[1]), attr_int("keepdims", 0)],
        )
        .output("y")
        .import()
        .expect("import");
    let values: Vec<i64> = vec![3, 5, 7, 1 << 20, 11, -2, 1, 9, 1 << 30, 3];
    let want: Vec<i64> = values.chunks(5).map(|r| r.iter().product()).collect();
    let x = Tensor::typed(vec![2, 5], values).expect("x");
    for got in run_everywhere(&m, std::slice::from_ref(&x)) {
        assert_eq!(got.expect("run")[0].data.as_i64(), Some(&want[..]));
    }
}

#[test]
fn recurrent_ops_refuse_clipping_and_lengths_beyond_the_sequence_by_name() {
    let rnn = |attrs: Vec<smelt::onnx::proto::AttributeProto>, lens: Option<&[i64]>| {
        let mut m = Model::new(14)
            .input("x", &[2, 1, 3])
            .input("w", &[1, 4, 3])
            .input("r", &[1, 4, 4]);
        let mut inputs = vec!["x", "w", "r"];
        if let Some(l) = lens {
            m = m.init(i64_typed("lens", l));
            inputs.extend(["", "lens"]);
        }
        m.node("RNN", "cell", &inputs, &["y", "h"], attrs)
            .output("h")
            .import()
    };
    rnn(vec![attr_int("hidden_size", 4)], Some(&[2])).expect("the whole sequence imports");
    let e = error_text(
        rnn(
            vec![attr_int("hidden_size", 4), attr_float("clip", 1.0)],
            None,
        ),
        "onnx-unsupported-attribute",
    );
    assert!(e.contains("'clip'") && e.contains("cell"), "{e}");
    rnn(vec![attr_int("hidden_size", 4)], Some(&[1])).expect("a shorter length imports");
    let e = error_text(
        rnn(vec![attr_int("hidden_size", 4)], Some(&[3])),
        "onnx-bad-model",
    );
    assert!(e.contains("sequence_lens [3]") && e.contains("cell"), "{e}");
}

#[test]
fn cumsum_of_int64_is_exact_and_follows_exclusive_and_reverse() {
    let values: Vec<i64> = vec![3, 1 << 40, -7, 5, 1 << 30, 11];
    let x = Tensor::typed(vec![6], values.clone()).expect("x");
    for (exclusive, reverse) in [(0, 0), (1, 0), (0, 1), (1, 1)] {
        let m = Model::new(14)
            .input_dims("x", INT64, &fixed(&[6]))
            .init(i64_typed("axis", &[0]))
            .node(
                "CumSum",
                "scan",
                &["x", "axis"],
                &["y"],
                vec![
                    attr_int("exclusive", exclusive),
                    attr_int("reverse", reverse),
                ],
            )
            .output("y")
            .import()
            .expect("import");
        // the definition: the sum of the elements before (or after) each, itself included
        // unless exclusive
        let want: Vec<i64> = (0..values.len())
            .map(|i| {
                (0..values.len())
                    .filter(|&j| match (reverse == 1, exclusive == 1) {
                        (false, false) => j <= i,
                        (false, true) => j < i,
                        (true, false) => j >= i,
                        (true, true) => j > i,
                    })
                    .map(|j| values[j])
                    .sum()
            })
            .collect();
        for got in run_everywhere(&m, std::slice::from_ref(&x)) {
            let got = got.expect("run");
            assert_eq!(
                got[0].data.as_i64(),
                Some(&want[..]),
                "exclusive {exclusive} reverse {reverse}"
            );
        }
    }
}

fn scatter_model(
    op: &str,
    indices: TensorProto,
    updates: &[i64],
    attrs: Vec<smelt::onnx::proto::AttributeProto>,
) -> Model {
    Model::new(18)
        .input("data", &[2, 3])
        .input("updates", updates)
        .init(indices)
        .node(op, "place", &["data", "indices", "updates"], &["y"], attrs)
        .output("y")
}

/// `indices` as an int64 initializer of shape `dims`.
fn i64_shaped(dims: &[i64], values: &[i64]) -> TensorProto {
    let mut t = i64_typed("indices", values);
    t.dims = dims.to_vec();
    t
}

#[test]
fn scatter_elements_combines_duplicate_indices_in_order_and_wraps_negative_ones() {
    let data: Vec<f32> = (1..=6).map(|v| v as f32).collect();
    let updates = [10.0f32, 20.0, 30.0, 40.0];
    // row 0: both updates land on column 2 (-1 wrapped); row 1: columns 0 and 1
    let indices = [2i64, -1, 0, 1];
    for (reduction, combine) in [
        ("add", (|a: f32, b: f32| a + b) as fn(f32, f32) -> f32),
        ("mul", |a, b| a * b),
        ("max", f32::max),
        ("min", f32::min),
        ("none", |_, b| b),
    ] {
        let m = scatter_model(
            "ScatterElements",
            i64_shaped(&[2, 2], &indices),
            &[2, 2],
            vec![attr_int("axis", 1), attr_string("reduction", reduction)],
        )
        .import()
        .expect("import");
        let mut want = data.clone();
        for (p, (&i, &u)) in indices.iter().zip(&updates).enumerate() {
            let at = (p / 2) * 3 + i.rem_euclid(3) as usize;
            want[at] = combine(want[at], u);
        }
        let inputs = [
            Tensor::new(vec![2, 3], data.clone()).expect("data"),
            Tensor::new(vec![2, 2], updates.to_vec()).expect("updates"),
        ];
        for got in run_everywhere(&m, &inputs) {
            assert_eq!(got.expect("run")[0].f32s(), want.as_slice(), "{reduction}");
        }
    }
}

#[test]
fn scatter_nd_replaces_whole_rows_and_refuses_an_index_out_of_range_by_name() {
    let m = scatter_model("ScatterND", i64_shaped(&[1, 1], &[-1]), &[1, 3], vec![])
        .import()
        .expect("import");
    let inputs = [
        Tensor::new(vec![2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).expect("data"),
        Tensor::new(vec![1, 3], vec![7.0, 8.0, 9.0]).expect("updates"),
    ];
    for got in run_everywhere(&m, &inputs) {
        assert_eq!(got.expect("run")[0].f32s(), &[1.0, 2.0, 3.0, 7.0, 8.0, 9.0]);
    }
    let bad = scatter_model("ScatterND", i64_shaped(&[1, 1], &[2]), &[1, 3], vec![]);
    let e = error_text(bad.import(), "onnx-bad-model");
    assert!(
        e.contains("index 2 is out of range for axis 0 of size 2"),
        "{e}"
    );
    assert!(e.contains("place"), "{e}");
}

#[test]
fn scatter_with_indices_computed_at_run_time_is_refused_by_name() {
    let m = Model::new(18)
        .input("data", &[2, 3])
        .input_dims("indices", INT64, &fixed(&[2, 2]))
        .input("updates", &[2, 2])
        .node(
            "ScatterElements",
            "place",
            &["data", "indices", "updates"],
            &["y"],
            vec![],
        )
        .output("y");
    let e = error_text(m.import(), "onnx-dynamic-shape");
    assert!(e.contains("place") && e.contains("indices"), "{e}");
}

fn reverse_sequence_model(lens: &[i64]) -> Model {
    let mut l = i64_typed("lens", lens);
    l.dims = vec![lens.len() as i64];
    Model::new(10)
        .input("x", &[3, 2])
        .init(l)
        .node(
            "ReverseSequence",
            "flip",
            &["x", "lens"],
            &["y"],
            vec![attr_int("batch_axis", 1), attr_int("time_axis", 0)],
        )
        .output("y")
}

#[test]
fn reverse_sequence_reverses_each_batch_entry_up_to_its_length_and_refuses_a_longer_one() {
    // x[t, b] = 10·t + b; batch 0 reversed over all 3 steps, batch 1 over its first 2
    let m = reverse_sequence_model(&[3, 2]).import().expect("import");
    let x = Tensor::new(vec![3, 2], vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]).expect("x");
    for got in run_everywhere(&m, &[x]) {
        assert_eq!(
            got.expect("run")[0].f32s(),
            &[20.0, 11.0, 10.0, 1.0, 0.0, 21.0]
        );
    }
    let e = error_text(reverse_sequence_model(&[4, 1]).import(), "onnx-bad-model");
    assert!(e.contains("sequence length 4") && e.contains("flip"), "{e}");
}

#[test]
fn top_k_takes_equal_values_by_lower_position_and_nan_as_the_extreme() {
    let mut k = i64_typed("k", &[3]);
    k.dims = vec![1];
    let x = [1.0f32, 3.0, 3.0, f32::NAN, f32::NEG_INFINITY, 3.0];
    for (largest, want_indices) in [(1, [3i64, 1, 2]), (0, [3, 4, 0])] {
        let m = Model::new(11)
            .input("x", &[6])
            .init(k.clone())
            .node(
                "TopK",
                "top",
                &["x", "k"],
                &["values", "indices"],
                vec![attr_int("largest", largest)],
            )
            .output("values")
            .output("indices")
            .import()
            .expect("import");
        let input = Tensor::new(vec![6], x.to_vec()).expect("x");
        for got in run_everywhere(&m, std::slice::from_ref(&input)) {
            let got = got.expect("run");
            let want: Vec<f32> = want_indices.iter().map(|&i| x[i as usize]).collect();
            let values = got[0].f32s();
            assert!(
                values
                    .iter()
                    .zip(&want)
                    .all(|(a, b)| a == b || (a.is_nan() && b.is_nan())),
                "largest {largest}: {values:?}"
            );
            assert_eq!(
                got[1].data.as_i64(),
                Some(&want_indices[..]),
                "largest {largest}"
            );
        }
    }
}

#[test]
fn bitwise_not_keeps_unsigned_elements_in_their_width_and_signed_ones_signed() {
    for (elem_type, x, want) in [
        (2, vec![0, 1, 200], vec![255i64, 254, 55]),
        (6, vec![-1, 5, 0], vec![0, -6, -1]),
    ] {
        let t = TensorProto {
            name: Some("x".into()),
            dims: vec![3],
            data_type: Some(elem_type),
            int32_data: x,
            ..Default::default()
        };
        let m = Model::new(18)
            .init(t)
            .node("BitwiseNot", "flip", &["x"], &["n"], vec![])
            .node(
                "Cast",
                "widen",
                &["n"],
                &["y"],
                vec![attr_int("to", INT64 as i64)],
            )
            .output("y")
            .import()
            .expect("import");
        for got in run_everywhere(&m, &[]) {
            assert_eq!(got.expect("run")[0].data.as_i64(), Some(&want[..]));
        }
    }
}

fn einsum_model(equation: &str, a: &[i64], b: &[i64], b_type: i32) -> Model {
    Model::new(13)
        .input("a", a)
        .input_dims("b", b_type, &fixed(b))
        .node(
            "Einsum",
            "contract",
            &["a", "b"],
            &["y"],
            vec![attr_string("equation", equation)],
        )
        .output("y")
}

/// An equation, the operands' dims, the second's element type, the error code and a part
/// of its message.
type EinsumCase = (
    &'static str,
    &'static [i64],
    &'static [i64],
    i32,
    &'static str,
    &'static str,
);

#[test]
fn einsum_refuses_a_malformed_equation_or_operand_by_name() {
    let cases: [EinsumCase; 6] = [
        (
            "ij,jk->ix",
            &[2, 3],
            &[3, 4],
            FLOAT,
            "onnx-bad-attribute",
            "'x', which no operand has",
        ),
        (
            "ij,jk->ii",
            &[2, 3],
            &[3, 4],
            FLOAT,
            "onnx-bad-attribute",
            "repeats a label",
        ),
        (
            "ij,j1->i",
            &[2, 3],
            &[3, 4],
            FLOAT,
            "onnx-bad-attribute",
            "holds '1'",
        ),
        (
            "ijk,jk->i",
            &[2, 3],
            &[3, 4],
            FLOAT,
            "onnx-bad-attribute",
            "labels 3 axes of an operand of rank 2",
        ),
        (
            "ij,jk->ik",
            &[2, 3],
            &[5, 4],
            FLOAT,
            "onnx-bad-attribute",
            "label 'j' is 3 long",
        ),
        (
            "ij,jk->ik",
            &[2, 3],
            &[3, 4],
            INT64,
            "onnx-unsupported-dtype",
            "operand 1 is i64",
        ),
    ];
    for (equation, a, b, b_type, code, wanted) in cases {
        let e = error_text(einsum_model(equation, a, b, b_type).import(), code);
        assert!(
            e.contains(wanted) && e.contains("contract"),
            "{equation}: {e}"
        );
    }
}

#[test]
fn einsum_of_a_size_one_broadcast_label_sums_the_other_operand() {
    // 'j' is 1 long in a and 3 in b: a broadcasts along it, so y[i,k] = a[i,0] · Σ_j b[j,k]
    let m = einsum_model("ij,jk->ik", &[2, 1], &[3, 2], FLOAT)
        .import()
        .expect("import");
    let a = Tensor::new([2, 1], vec![2.0, -1.0]).unwrap();
    let b = Tensor::new([3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let want = [18.0, 24.0, -9.0, -12.0];
    for got in run_everywhere(&m, &[a.clone(), b.clone()]) {
        assert_eq!(got.expect("run")[0].f32s(), &want[..]);
    }
}

#[test]
fn non_zero_folds_on_a_constant_and_is_refused_on_run_time_data_by_name() {
    let constant = Model::new(13)
        .init(f32_typed("x", &[2, 3], &[0.0, 1.5, 0.0, -2.0, 0.0, 3.0]))
        .node("NonZero", "where_set", &["x"], &["y"], vec![])
        .output("y")
        .import()
        .expect("import");
    let got = smelt::ir::interp::run(&constant, &constant.funcs[0], &[]).expect("run");
    assert_eq!(got[0].dims(), [2, 3]);
    assert_eq!(got[0].data.as_i64(), Some(&[0i64, 1, 1, 1, 0, 2][..]));
    let run_time = Model::new(13)
        .input("x", &[2, 3])
        .node("NonZero", "where_set", &["x"], &["y"], vec![])
        .output("y");
    let e = error_text(run_time.import(), "onnx-dynamic-shape");
    assert!(e.contains("where_set") && e.contains("non-zero"), "{e}");
}

#[test]
fn group_normalization_of_opset_18_repeats_each_groups_scale_over_its_channels() {
    // [1, 4, 3] in 2 groups of 2 channels: each group standardized over its 6 values,
    // then scaled and shifted by its group's (opset 18) parameters
    let x: Vec<f32> = (0..12)
        .map(|i| ((i * 7) % 5) as f32 - 1.5 * (i / 6) as f32)
        .collect();
    let (scale, bias) = ([2.0f32, -0.5], [0.25f32, 1.0]);
    let m = Model::new(18)
        .input("x", &[1, 4, 3])
        .init(f32_typed("scale", &[2], &scale))
        .init(f32_typed("bias", &[2], &bias))
        .node(
            "GroupNormalization",
            "gn",
            &["x", "scale", "bias"],
            &["y"],
            vec![attr_int("num_groups", 2), attr_float("epsilon", 1e-3)],
        )
        .output("y")
        .import()
        .expect("import");
    let mut want = Vec::new();
    for g in 0..2 {
        let part = &x[g * 6..g * 6 + 6];
        let mean = part.iter().map(|&v| f64::from(v)).sum::<f64>() / 6.0;
        let var = part
            .iter()
            .map(|&v| (f64::from(v) - mean).powi(2))
            .sum::<f64>()
            / 6.0;
        for &v in part {
            let y = (f64::from(v) - mean) / (var + 1e-3).sqrt();
            want.push(f64::from(scale[g]) * y + f64::from(bias[g]));
        }
    }
    let input = Tensor::new([1, 4, 3], x.clone()).unwrap();
    for got in run_everywhere(&m, std::slice::from_ref(&input)) {
        let got = got.expect("run");
        for (g, w) in got[0].f32s().iter().zip(&want) {
            assert!(
                (f64::from(*g) - w).abs() < 1e-5,
                "{:?} vs {want:?}",
                got[0].f32s()
            );
        }
    }
}

#[test]
fn gather_nd_takes_run_time_index_tuples_and_refuses_one_out_of_range_at_run_time() {
    // data [2, 3, 2]; batch_dims 1: per batch entry, tuples (row) picking a [2] slice
    let m = Model::new(13)
        .input("data", &[2, 3, 2])
        .input_dims("idx", INT64, &fixed(&[2, 2, 1]))
        .node(
            "GatherND",
            "pick_rows",
            &["data", "idx"],
            &["y"],
            vec![attr_int("batch_dims", 1)],
        )
        .output("y")
        .import()
        .expect("import");
    let data = Tensor::new([2, 3, 2], (0..12).map(|v| v as f32).collect()).unwrap();
    let idx = Tensor::typed([2, 2, 1], vec![2i64, -3, 1, 0]).unwrap();
    // entry 0 rows 2 and 0 (−3 wraps); entry 1 rows 1 and 0
    let want = [4.0, 5.0, 0.0, 1.0, 8.0, 9.0, 6.0, 7.0];
    for got in run_everywhere(&m, &[data.clone(), idx]) {
        assert_eq!(got.expect("run")[0].f32s(), &want[..]);
    }
    let bad = Tensor::typed([2, 2, 1], vec![0i64, 3, 1, 0]).unwrap();
    for got in run_everywhere(&m, &[data.clone(), bad]) {
        let e = got.expect_err("an index out of range is an error");
        assert!(e.contains("gather") || e.contains("index"), "{e}");
    }
}

/// AffineGrid of `theta` for `size`, then GridSample of `x` (opset 20).
fn affine_sample_model(
    size: &[i64],
    theta: &[i64],
    attrs: Vec<smelt::onnx::proto::AttributeProto>,
) -> Model {
    Model::new(20)
        .input("x", size)
        .input("theta", theta)
        .init(i64_typed("size", size))
        .node("AffineGrid", "grid", &["theta", "size"], &["g"], vec![])
        .node("GridSample", "sample", &["x", "g"], &["y"], attrs)
        .output("y")
}

#[test]
fn an_identity_affine_grid_samples_every_element_back_in_every_kernel_choice() {
    // the identity transform's grid is each element's own centre: linear and cubic
    // sampling give the input back, image and volume alike
    for (size, theta) in [
        (&[2, 3, 4, 5][..], vec![1.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
        (
            &[2, 2, 3, 4, 5][..],
            vec![1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0],
        ),
    ] {
        let r = size.len() - 2;
        let theta_dims = [size[0], r as i64, r as i64 + 1];
        for mode in ["linear", "cubic"] {
            let m = affine_sample_model(size, &theta_dims, vec![attr_string("mode", mode)])
                .import()
                .expect("import");
            let dims: Vec<usize> = size.iter().map(|&d| d as usize).collect();
            let x = jit_util::random(&dims, 5);
            let mut thetas = theta.clone();
            thetas.extend(theta.iter().copied());
            let theta_t = Tensor::new(
                theta_dims.iter().map(|&d| d as usize).collect::<Vec<_>>(),
                thetas,
            )
            .expect("theta");
            for got in run_everywhere(&m, &[x.clone(), theta_t]) {
                let got = got.expect("run");
                let e = smelt::ir::ErrorStats::between_tensors(&got[0], &x).expect("same shape");
                assert!(e.max_abs < 1e-5, "{mode} {size:?}: max abs {}", e.max_abs);
            }
        }
    }
}

#[test]
fn grid_sample_and_affine_grid_refuse_what_their_opset_does_not_define_by_name() {
    // opset 20 renamed bilinear to linear
    let e = error_text(
        affine_sample_model(
            &[1, 1, 3, 3],
            &[1, 2, 3],
            vec![attr_string("mode", "bilinear")],
        )
        .import(),
        "onnx-bad-attribute",
    );
    assert!(
        e.contains("'bilinear' is not a mode of GridSample-20"),
        "{e}"
    );
    let e = error_text(
        affine_sample_model(
            &[1, 1, 3, 3],
            &[1, 2, 3],
            vec![attr_string("padding_mode", "wrap")],
        )
        .import(),
        "onnx-bad-attribute",
    );
    assert!(e.contains("padding_mode"), "{e}");
    // a 2-D transform for a volume
    let e = error_text(
        affine_sample_model(&[1, 1, 2, 3, 3], &[1, 2, 3], vec![]).import(),
        "onnx-bad-model",
    );
    assert!(e.contains("must be [N, 3, 4]"), "{e}");
    // volumes need opset 20
    let volume = Model::new(16)
        .input("x", &[1, 1, 2, 3, 3])
        .input("g", &[1, 2, 2, 2, 3])
        .node("GridSample", "sample", &["x", "g"], &["y"], vec![])
        .output("y");
    let e = error_text(volume.import(), "onnx-bad-model");
    assert!(e.contains("volumes need opset 20"), "{e}");
}

#[test]
fn an_integer_conv_too_long_to_sum_exactly_in_f32_chunks_is_refused_by_name() {
    // two groups of 64 channels by a 3x3 kernel: 576 products per group, which smelt
    // would have to split inside a group
    let m = Model::new(13)
        .input_dims("x", 2, &fixed(&[1, 128, 5, 5]))
        .input_dims("w", 2, &fixed(&[4, 64, 3, 3]))
        .node(
            "ConvInteger",
            "grouped",
            &["x", "w"],
            &["y"],
            vec![attr_int("group", 2)],
        )
        .output("y");
    let e = error_text(m.import(), "onnx-unsupported-op");
    assert!(e.contains("grouped") && e.contains("256"), "{e}");
}
