//! `pad` through the interpreter and the JIT: every mode (constant, reflect, edge, wrap)
//! on f32, i64, i32 and i1, with crops (negative pads), a fill value operand read at run
//! time, hand-computed results for each mode, and clear errors for pads that do not fit.

mod jit_util;

use jit_util::check_against_interp;
use smelt_ir::{Module, Tensor, TensorData};

fn parse(src: &str) -> Result<Module, String> {
    smelt_ir::text::parse(src, "pad.tir").map_err(|d| d.to_string())
}

fn dims_text(dims: &[usize], dtype: &str) -> String {
    let mut s = String::from("tensor<");
    for d in dims {
        s += &format!("{d}x");
    }
    s + dtype + ">"
}

/// The result dims of a pad of `dims` by `pads` (begins, then ends).
fn padded(dims: &[usize], pads: &[i64]) -> Vec<usize> {
    let r = dims.len();
    (0..r)
        .map(|k| (dims[k] as i64 + pads[k] + pads[k + r]) as usize)
        .collect()
}

/// A module padding `x` of `dims` and `dtype` by `pads` in `mode`, with a fill value
/// parameter when `fill` is set.
fn pad_module(dims: &[usize], dtype: &str, pads: &[i64], mode: &str, fill: bool) -> String {
    let x = dims_text(dims, dtype);
    let out = dims_text(&padded(dims, pads), dtype);
    let pads: Vec<String> = pads.iter().map(i64::to_string).collect();
    let (param, operand) = if fill {
        (format!(", %v: tensor<{dtype}>"), ", %v")
    } else {
        (String::new(), "")
    };
    format!(
        "func @f(%x: {x}{param}) -> (y: {out}) {{
  %y = pad %x{operand} {{pads = [{}], mode = {mode}}} : {out}
  return %y : {out}
}}",
        pads.join(", ")
    )
}

/// Every mode, every element type, pads that grow, crop, or both, checked exactly
/// against the interpreter with every kernel choice.
#[test]
fn every_mode_on_every_element_type_matches_the_interpreter() {
    // (dims, pads): reflect needs each pad below the kept extent, so these fit it
    let cases: &[(&[usize], &[i64])] = &[
        (&[2, 3, 6], &[0, 1, 2, 1, 0, 3]),
        (&[2, 3, 6], &[0, -1, 2, 0, 1, -2]),
        (&[7], &[3, 2]),
        (&[3, 9], &[2, 0, 1, 5]),
    ];
    for (dtype, seed) in [("f32", 1), ("i64", 2), ("i32", 3), ("i1", 4)] {
        for (dims, pads) in cases {
            for mode in ["constant", "reflect", "edge", "wrap"] {
                let what = format!("pad {dtype} {dims:?} by {pads:?} in {mode}");
                let m = parse(&pad_module(dims, dtype, pads, mode, false))
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                let inputs = jit_util::random_inputs(&m, seed);
                check_against_interp(&what, &m, &inputs, 0.0);
            }
        }
    }
}

/// Wrap pads longer than their axis wrap around more than once.
#[test]
fn wrap_and_edge_pads_longer_than_the_axis() {
    for mode in ["wrap", "edge", "constant"] {
        let what = format!("long {mode} pads");
        let m = parse(&pad_module(&[2, 3], "i64", &[1, 7, 0, 5], mode, false)).unwrap();
        let inputs = jit_util::random_inputs(&m, 9);
        check_against_interp(&what, &m, &inputs, 0.0);
    }
}

/// The fill is an operand read at run time, so integers far above 2^24 stay exact.
#[test]
fn constant_fill_operand_is_exact_on_every_type() {
    let big = (1i64 << 50) + 3;
    let fills = [
        ("f32", Tensor::typed([], vec![1.25f32]).unwrap()),
        ("i64", Tensor::typed([], vec![big]).unwrap()),
        ("i32", Tensor::typed([], vec![-7i32]).unwrap()),
        ("i1", Tensor::typed([], vec![true]).unwrap()),
    ];
    for (dtype, fill) in fills {
        let what = format!("pad {dtype} with a fill operand");
        let m = parse(&pad_module(&[2, 5], dtype, &[1, 2, 0, 3], "constant", true)).unwrap();
        let x = jit_util::random_inputs(&m, 5).remove(0);
        let got = check_against_interp(&what, &m, &[x, fill.clone()], 0.0);
        // the first row is all fill
        let first = got[0].data.pick(&[0, 9]);
        assert_eq!(first, fill.data.pick(&[0, 0]), "{what}");
    }
    let m = parse(&pad_module(&[3], "i64", &[1, 1], "constant", true)).unwrap();
    let x = Tensor::typed([3], vec![1i64, 2, 3]).unwrap();
    let v = Tensor::typed([], vec![big]).unwrap();
    let got = check_against_interp("exact fill", &m, &[x, v], 0.0);
    assert_eq!(got[0].data, TensorData::I64(vec![big, 1, 2, 3, big]));
}

/// Each mode against values worked out by hand, through the JIT.
#[test]
fn modes_give_the_hand_computed_values() {
    let x = Tensor::typed([4], vec![10i64, 20, 30, 40]).unwrap();
    let want: [(&str, &[i64], Vec<i64>); 5] = [
        ("constant", &[2, 1], vec![0, 0, 10, 20, 30, 40, 0]),
        ("reflect", &[3, 2], vec![40, 30, 20, 10, 20, 30, 40, 30, 20]),
        ("edge", &[2, 1], vec![10, 10, 10, 20, 30, 40, 40]),
        (
            "wrap",
            &[5, 2],
            vec![40, 10, 20, 30, 40, 10, 20, 30, 40, 10, 20],
        ),
        // crop one at the begin, then reflect the kept [20, 30, 40] at the end
        ("reflect", &[-1, 2], vec![20, 30, 40, 30, 20]),
    ];
    for (mode, pads, values) in want {
        let m = parse(&pad_module(&[4], "i64", pads, mode, false)).unwrap();
        let got = check_against_interp(mode, &m, std::slice::from_ref(&x), 0.0);
        assert_eq!(got[0].data, TensorData::I64(values), "{mode} {pads:?}");
    }
}

/// Pads that do not fit are refused at parse time (by the verifier) with the reason.
#[test]
fn bad_pads_are_clear_errors() {
    let reflect = pad_module(&[2, 3], "f32", &[0, 3, 0, 0], "reflect", false);
    let e = parse(&reflect).unwrap_err();
    assert!(
        e.contains("reflect") && e.contains("smaller than the 3"),
        "{e}"
    );
    let short = "func @f(%x: tensor<2x3xf32>) -> (y: tensor<2x4xf32>) {
  %y = pad %x {pads = [0, 1]} : tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}";
    let e = parse(short).unwrap_err();
    assert!(e.contains("4 values") && e.contains("got 2"), "{e}");
    // a crop of more than the axis holds is an error, whatever the other side pads
    let crop = pad_module(&[2, 3], "f32", &[0, -4, 0, 1], "constant", false);
    let e = parse(&crop).unwrap_err();
    assert!(e.contains("crop more than its 3"), "{e}");
    // edge and wrap have nothing to repeat on an axis cropped to nothing
    let crop = pad_module(&[2, 3], "f32", &[0, -3, 0, 1], "edge", false);
    let e = parse(&crop).unwrap_err();
    assert!(e.contains("keeps none"), "{e}");
    let fill_in_edge = "func @f(%x: tensor<3xf32>, %v: tensor<f32>) -> (y: tensor<5xf32>) {
  %y = pad %x, %v {pads = [1, 1], mode = edge} : tensor<5xf32>
  return %y : tensor<5xf32>
}";
    assert!(parse(fill_in_edge).unwrap_err().contains("edge mode"));
    let wrong_fill = "func @f(%x: tensor<3xi64>, %v: tensor<f32>) -> (y: tensor<5xi64>) {
  %y = pad %x, %v {pads = [1, 1]} : tensor<5xi64>
  return %y : tensor<5xi64>
}";
    assert!(parse(wrong_fill).unwrap_err().contains("one element type"));
    let mode = "func @f(%x: tensor<3xf32>) -> (y: tensor<5xf32>) {
  %y = pad %x {pads = [1, 1], mode = mirror} : tensor<5xf32>
  return %y : tensor<5xf32>
}";
    let e = parse(mode).unwrap_err();
    assert!(e.contains("pad mode") && e.contains("'mirror'"), "{e}");
}
