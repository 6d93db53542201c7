//! int8, uint8, int16 and uint16: the JIT's casts against the interpreter at edge values
//! (wrapping from wider integers, saturation and NaN from floats, sign and zero
//! extension), ONNX int8/uint8 nodes computed widened to i32 and wrapped back against
//! the narrow types' own wrapping arithmetic, `.npy` round trips and the C API's element
//! types (QDQ models against onnxruntime are in `onnx_quant.rs`).

mod jit_util;
mod onnx_build;

use smelt_ir::{interp, DType, Tensor, TensorData, TensorType};

/// f32 edge values for the casts to narrow integers: the bounds of each type and just
/// past them, halves (truncated toward zero), huge values, infinities and NaN.
const FLOATS: [f32; 24] = [
    0.0,
    -0.0,
    0.9,
    -0.9,
    1.5,
    -1.5,
    127.0,
    127.9,
    128.0,
    -128.0,
    -128.9,
    -129.0,
    255.0,
    255.9,
    256.0,
    32767.5,
    -32768.5,
    65535.9,
    65536.0,
    1e10,
    -1e10,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
];

/// i32 edge values: the narrow types' bounds, one past them, and values whose low bits
/// are those bounds.
const INTS: [i32; 16] = [
    0,
    1,
    -1,
    127,
    128,
    -128,
    -129,
    255,
    256,
    32767,
    32768,
    -32769,
    65535,
    65536,
    i32::MAX,
    i32::MIN,
];

const CASTS: &str = "func @f(%x: tensor<24xf32>, %n: tensor<16xi32>) -> (a: tensor<24xi8>, b: tensor<24xui8>, c: tensor<24xi16>, d: tensor<24xui16>, e: tensor<16xi8>, f: tensor<16xui8>, g: tensor<16xi16>, h: tensor<16xui16>, i: tensor<16xi32>, j: tensor<16xi64>, k: tensor<16xf32>, l: tensor<16xi32>, m: tensor<16xi1>, o: tensor<16xui16>, p: tensor<24xf16>, q: tensor<16xi8>) {
  %a = cast %x {to = i8} : tensor<24xi8>
  %b = cast %x {to = ui8} : tensor<24xui8>
  %c = cast %x {to = i16} : tensor<24xi16>
  %d = cast %x {to = ui16} : tensor<24xui16>
  %e = cast %n {to = i8} : tensor<16xi8>
  %f = cast %n {to = ui8} : tensor<16xui8>
  %g = cast %n {to = i16} : tensor<16xi16>
  %h = cast %n {to = ui16} : tensor<16xui16>
  %i = cast %e {to = i32} : tensor<16xi32>
  %j = cast %h {to = i64} : tensor<16xi64>
  %k = cast %g {to = f32} : tensor<16xf32>
  %l = cast %f {to = i32} : tensor<16xi32>
  %m = cast %e {to = i1} : tensor<16xi1>
  %o = cast %e {to = ui16} : tensor<16xui16>
  %p = cast %a {to = f16} : tensor<24xf16>
  %q = cast %m {to = i8} : tensor<16xi8>
  return %a, %b, %c, %d, %e, %f, %g, %h, %i, %j, %k, %l, %m, %o, %p, %q : tensor<24xi8>, tensor<24xui8>, tensor<24xi16>, tensor<24xui16>, tensor<16xi8>, tensor<16xui8>, tensor<16xi16>, tensor<16xui16>, tensor<16xi32>, tensor<16xi64>, tensor<16xf32>, tensor<16xi32>, tensor<16xi1>, tensor<16xui16>, tensor<24xf16>, tensor<16xi8>
}";

#[test]
fn jit_casts_wrap_saturate_and_extend_as_the_interpreter_does() {
    let m = smelt_ir::text::parse(CASTS, "casts.tir").unwrap_or_else(|d| panic!("{d}"));
    let x = Tensor::new([24], FLOATS.to_vec()).unwrap();
    let n = Tensor::typed([16], INTS.to_vec()).unwrap();
    let inputs = [x, n];
    let want = interp::run(&m, &m.funcs[0], &inputs).expect("interprets");
    // the interpreter's rules, spelled out at the edges: floats truncate and saturate
    // (NaN is 0), integers keep their low bits, narrow integers extend by their sign
    let TensorData::I8(a) = &want[0].data else {
        panic!("i8 result")
    };
    assert_eq!(&a[6..12], &[127, 127, 127, -128, -128, -128]);
    assert_eq!(&a[19..], &[127, -128, 127, -128, 0]);
    let TensorData::U8(b) = &want[1].data else {
        panic!("ui8 result")
    };
    assert_eq!(
        &b[2..6],
        &[0, 0, 1, 0],
        "toward zero, negatives saturate at 0"
    );
    assert_eq!(&b[12..15], &[255, 255, 255]);
    let TensorData::I8(e) = &want[4].data else {
        panic!("i8 result")
    };
    assert_eq!(&e[3..9], &[127, -128, -128, 127, -1, 0], "wraps");
    let TensorData::U16(h) = &want[7].data else {
        panic!("ui16 result")
    };
    assert_eq!((h[2], h[12], h[13]), (65535, 65535, 0));
    let TensorData::I32(i) = &want[8].data else {
        panic!("i32 result")
    };
    assert_eq!(i[4], -128, "128 wrapped to i8 sign-extends back");
    let TensorData::I32(l) = &want[11].data else {
        panic!("i32 result")
    };
    assert_eq!(l[2], 255, "ui8 zero-extends");
    // the JIT computes the same elements on every kernel choice (no NaN in the
    // results: the float outputs come from integers or are f16 of integers)
    let got = jit_util::check_against_interp("narrow casts", &m, &inputs, 0.0);
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g.data == w.data, "output {k}: {:?} vs {:?}", g.data, w.data);
    }
}

#[test]
fn narrow_integers_move_through_transpose_concat_slice_pad_and_gather() {
    let src = "func @f(%a: tensor<2x3xi8>, %b: tensor<2x3xui16>, %i: tensor<2xi64>) -> (t: tensor<3x2xi8>, c: tensor<4x3xui16>, s: tensor<2x2xi8>, p: tensor<2x5xui16>, g: tensor<2x3xi8>) {
  %t = transpose %a {perm = [1, 0]} : tensor<3x2xi8>
  %c = concat %b, %b {axis = 0} : tensor<4x3xui16>
  %s = slice %a {starts = [0, 1], ends = [2, 3], steps = [1, 1]} : tensor<2x2xi8>
  %p = pad %b {pads = [0, 1, 0, 1]} : tensor<2x5xui16>
  %g = gather %a, %i {axis = 0} : tensor<2x3xi8>
  return %t, %c, %s, %p, %g : tensor<3x2xi8>, tensor<4x3xui16>, tensor<2x2xi8>, tensor<2x5xui16>, tensor<2x3xi8>
}";
    let m = smelt_ir::text::parse(src, "moves.tir").unwrap_or_else(|d| panic!("{d}"));
    let a = Tensor::typed([2, 3], vec![-128i8, -1, 0, 1, 100, 127]).unwrap();
    let b = Tensor::typed([2, 3], TensorData::U16(vec![0, 1, 255, 256, 40000, 65535])).unwrap();
    let i = Tensor::typed([2], vec![1i64, 0]).unwrap();
    let got = jit_util::check_against_interp("moves", &m, &[a, b, i], 0.0);
    assert_eq!(got[0].data, TensorData::I8(vec![-128, 1, -1, 100, 0, 127]));
    assert_eq!(
        got[3].data,
        TensorData::U16(vec![0, 0, 1, 255, 0, 0, 256, 40000, 65535, 0])
    );
    assert_eq!(got[4].data, TensorData::I8(vec![1, 100, 127, -128, -1, 0]));
}

#[test]
fn arithmetic_on_narrow_integers_is_a_type_error_naming_the_op() {
    let src = "func @f(%a: tensor<4xi8>) -> (y: tensor<4xi8>) {
  %y = add %a, %a : tensor<4xi8>
  return %y : tensor<4xi8>
}";
    // the parser checks types as it reads, or the verifier does: either names the op
    let err = match smelt_ir::text::parse(src, "add.tir") {
        Err(d) => d.to_string(),
        Ok(m) => smelt_ir::verify::verify_module(&m)
            .expect_err("add on i8 is refused")
            .to_string(),
    };
    assert!(err.contains("add") && err.contains("i8"), "{err}");
}

/// An ONNX model of int8 Add, Mul and Sub, uint8 BitShift both ways and Max on two
/// inputs of type `elem`.
fn arithmetic_model(elem: i32) -> smelt_ir::Module {
    use onnx_build::{attr_string, fixed, Model};
    Model::new(18)
        .input_dims("a", elem, &fixed(&[64]))
        .input_dims("b", elem, &fixed(&[64]))
        .node("Add", "add", &["a", "b"], &["sum"], vec![])
        .node("Mul", "mul", &["a", "b"], &["product"], vec![])
        .node("Sub", "sub", &["a", "b"], &["difference"], vec![])
        .node("Max", "max", &["a", "b"], &["max"], vec![])
        .output("sum")
        .output("product")
        .output("difference")
        .output("max")
        .node(
            "BitShift",
            "shl",
            &["a", "b"],
            &["left"],
            vec![attr_string("direction", "LEFT")],
        )
        .node(
            "BitShift",
            "shr",
            &["a", "b"],
            &["right"],
            vec![attr_string("direction", "RIGHT")],
        )
        .output("left")
        .output("right")
        .import()
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Every pair of a value series over the whole type and shifts 0 to 9 (past the width).
fn operands<T: Copy>(all: impl Fn(usize) -> T, shift: impl Fn(usize) -> T) -> (Vec<T>, Vec<T>) {
    ((0..64).map(&all).collect(), (0..64).map(&shift).collect())
}

#[test]
fn onnx_int8_nodes_compute_widened_to_i32_and_wrap_back_exactly() {
    let m = arithmetic_model(3);
    let f = &m.funcs[0];
    let types: Vec<DType> = f.results.iter().map(|r| f.type_of(r.value).dtype).collect();
    assert_eq!(types, [DType::I8; 6]);
    // the computations are on i32: only casts touch i8
    for inst in &f.insts {
        let reads_i8 = inst
            .operands
            .iter()
            .any(|&v| f.type_of(v).dtype == DType::I8);
        assert!(
            !reads_i8 || matches!(inst.op, smelt_ir::Op::Cast { .. }),
            "{:?} reads i8",
            inst.op
        );
    }
    let (a, b) = operands(
        |k| (k as i32 * 37 - 128) as i8,
        |k| {
            if k % 5 == 0 {
                -(k as i8 % 9)
            } else {
                (k % 10) as i8
            }
        },
    );
    let inputs = [
        Tensor::typed([64], a.clone()).unwrap(),
        Tensor::typed([64], b.clone()).unwrap(),
    ];
    let got = jit_util::check_against_interp("int8 arithmetic", &m, &inputs, 0.0);
    let each = |f: fn(i8, i8) -> i8| -> TensorData {
        TensorData::I8(a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect())
    };
    assert_eq!(got[0].data, each(i8::wrapping_add));
    assert_eq!(got[1].data, each(i8::wrapping_mul));
    assert_eq!(got[2].data, each(i8::wrapping_sub));
    assert_eq!(got[3].data, each(|x, y| x.max(y)));
    // ONNX's BitShift out of range (negative or the width or more): 0 to the left, the
    // sign to the right
    let shl = |x: i8, y: i8| {
        if (0..8).contains(&y) {
            ((x as u8) << y) as i8
        } else {
            0
        }
    };
    let shr = |x: i8, y: i8| if (0..8).contains(&y) { x >> y } else { x >> 7 };
    assert_eq!(got[4].data, each(shl));
    assert_eq!(got[5].data, each(shr));
}

#[test]
fn onnx_uint8_nodes_compute_widened_to_i32_and_wrap_back_exactly() {
    let m = arithmetic_model(2);
    let (a, b) = operands(|k| (k * 53 % 256) as u8, |k| (k % 10) as u8);
    let inputs = [
        Tensor::typed([64], a.clone()).unwrap(),
        Tensor::typed([64], b.clone()).unwrap(),
    ];
    let got = jit_util::check_against_interp("uint8 arithmetic", &m, &inputs, 0.0);
    let each = |f: fn(u8, u8) -> u8| -> TensorData {
        TensorData::U8(a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect())
    };
    assert_eq!(got[0].data, each(u8::wrapping_add));
    assert_eq!(got[1].data, each(u8::wrapping_mul));
    assert_eq!(got[2].data, each(u8::wrapping_sub));
    assert_eq!(got[3].data, each(|x, y| x.max(y)));
    assert_eq!(
        got[4].data,
        each(|x, y| x.checked_shl(y.into()).unwrap_or(0))
    );
    assert_eq!(
        got[5].data,
        each(|x, y| x.checked_shr(y.into()).unwrap_or(0))
    );
}

#[test]
fn npy_files_hold_the_narrow_integers_as_i1_u1_i2_and_u2() {
    let tensors = [
        (Tensor::typed([3], vec![-128i8, 0, 127]).unwrap(), "|i1"),
        (Tensor::typed([3], vec![0u8, 1, 255]).unwrap(), "|u1"),
        (Tensor::typed([2], vec![-32768i16, 32767]).unwrap(), "<i2"),
        (
            Tensor::typed([2], TensorData::U16(vec![0, 65535])).unwrap(),
            "<u2",
        ),
    ];
    for (t, descr) in tensors {
        let bytes = smelt::npy::encode(&t);
        let header = String::from_utf8_lossy(&bytes[..bytes.len().min(128)]).to_string();
        assert!(header.contains(&format!("'descr': '{descr}'")), "{header}");
        assert_eq!(smelt::npy::decode(&bytes).expect("decodes"), t);
    }
}

#[test]
fn random_narrow_integer_tensors_are_zeros_and_ones_of_their_type() {
    for dtype in [DType::I8, DType::U8, DType::I16, DType::U16] {
        let t = Tensor::random(&TensorType::new(dtype, [64]), 3);
        assert_eq!(t.dtype(), dtype);
        let v = t.data.to_i64s().expect("integers");
        assert!(v.iter().all(|&x| x == 0 || x == 1) && v.contains(&0) && v.contains(&1));
    }
}

#[test]
fn the_c_api_reports_and_runs_int8_and_uint16_buffers() {
    use smelt::capi::{smelt_executable_destroy, SmeltElementType, SmeltStatus};
    let src = "func @f(%x: tensor<4xi8>) -> (y: tensor<4xui16>) {
  %y = cast %x {to = ui16} : tensor<4xui16>
  return %y : tensor<4xui16>
}";
    let (exe, input, output) = jit_util::capi_from_text(src);
    assert_eq!(
        (input.element_type, output.element_type),
        (SmeltElementType::I8, SmeltElementType::U16)
    );
    let mut x: [i8; 4] = [-128, -1, 0, 127];
    let mut y = [0u16; 4];
    let run = |x: &mut [_; 4], y: &mut [_; 4], ty: SmeltElementType| {
        jit_util::capi_run_one(exe, x, ty, y, SmeltElementType::U16)
    };
    assert_eq!(run(&mut x, &mut y, SmeltElementType::I8), SmeltStatus::Ok);
    let want: Vec<u16> = x.iter().map(|&v| v as u16).collect();
    assert_eq!(y.to_vec(), want);
    // uint8 bytes where the tensor is int8: refused, not reinterpreted
    assert_eq!(
        run(&mut x, &mut y, SmeltElementType::U8),
        SmeltStatus::InvalidArgument
    );
    assert_eq!(smelt_executable_destroy(exe), SmeltStatus::Ok);
}

#[test]
fn text_weights_of_narrow_integers_are_integer_lists_checked_against_the_type() {
    let src = "const @a : tensor<3xi8> = dense<[-128, 0, 127]>
const @b : tensor<2xui16> = dense<[0, 65535]>
func @f() -> (a: tensor<3xi8>, b: tensor<2xui16>) {
  %a = const @a : tensor<3xi8>
  %b = const @b : tensor<2xui16>
  return %a, %b : tensor<3xi8>, tensor<2xui16>
}";
    let m = smelt_ir::text::parse(src, "w.tir").unwrap_or_else(|d| panic!("{d}"));
    let got = interp::run(&m, &m.funcs[0], &[]).expect("interprets");
    assert_eq!(got[0].data, TensorData::I8(vec![-128, 0, 127]));
    assert_eq!(got[1].data, TensorData::U16(vec![0, 65535]));
    let printed = smelt_ir::text::print(&m, &Default::default());
    let again = smelt_ir::text::parse(&printed, "printed.tir").unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(smelt_ir::text::print(&again, &Default::default()), printed);
    // a value outside the type is an error pointing at it, not wrapped
    let bad = src.replace("dense<[-128, 0, 127]>", "dense<[-128, 0, 128]>");
    let err = smelt_ir::text::parse(&bad, "bad.tir").expect_err("128 is no i8");
    let text = err.to_string();
    assert!(
        text.contains("the i8 range") && text.contains("bad.tir:1:"),
        "{text}"
    );
}
