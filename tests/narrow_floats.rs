//! float16 and bfloat16: the conversions against numpy and ml_dtypes at edge values
//! (ties, subnormals, overflow, infinities, NaN) and on random bit patterns, the JIT's
//! cast kernels bit for bit against them, data movement of 2-byte elements, and `.npy`
//! round trips, the C API's 2-byte element types (a float16 ONNX model against
//! onnxruntime is in `onnx_typed.rs`).

mod jit_util;
mod onnx_build;

use std::io::Write;
use std::process::{Command, Stdio};

use smelt_ir::half::{bf16_to_f32, f16_to_f32, f32_to_bf16, f32_to_f16};
use smelt_ir::{interp, weights::random_f32, DType, Tensor, TensorData};

/// Edge values of both formats: ties at 1 and in the subnormals, the largest finite
/// values and the halfway points past them, the smallest subnormals and half of them,
/// infinities, NaNs with payloads, signed zeros.
fn edge_values() -> Vec<f32> {
    let p = |e: i32| f32::powi(2.0, e);
    let mut v = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        1.0 + p(-11),
        1.0 + 3.0 * p(-11),
        1.0 + p(-11) + p(-23),
        1.0 + p(-8),
        1.0 + 3.0 * p(-8),
        1.0 + p(-8) + p(-20),
        65504.0,
        65519.0,
        65520.0,
        -65520.0,
        1e6,
        f32::MAX,
        -f32::MAX,
        f32::MIN_POSITIVE,
        p(-14),
        p(-14) - p(-25),
        p(-24),
        p(-25),
        p(-25) * 1.5,
        p(-26),
        3.0 * p(-25),
        1e-10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7fa0_0001),
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc1_2345),
        std::f32::consts::PI,
        0.1,
        -0.3,
    ];
    // random bit patterns over the whole range, and values near 1 where ties are dense
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(f32::from_bits((x >> 32) as u32));
    }
    v.extend(random_f32(7, 2000, -4.0, 4.0));
    v
}

/// numpy's float16 bits and ml_dtypes' bfloat16 bits of each value, and numpy's f32 of
/// every float16 and bfloat16 bit pattern, read from `$SMELT_PYTHON`.
fn oracle(values: &[f32]) -> (Vec<u16>, Vec<u16>, Vec<u32>, Vec<u32>) {
    let python = std::env::var("SMELT_PYTHON")
        .expect("SMELT_PYTHON names the venv python with numpy and ml_dtypes (scripts/test.sh)");
    let script = r#"
import sys, numpy as np, ml_dtypes
x = np.frombuffer(sys.stdin.buffer.read(), dtype='<f4')
with np.errstate(all='ignore'):
    h = x.astype(np.float16).view('<u2')
    b = x.astype(ml_dtypes.bfloat16).view('<u2')
bits = np.arange(65536, dtype='<u2')
hw = bits.view(np.float16).astype(np.float32).view('<u4')
bw = bits.view(ml_dtypes.bfloat16).astype(np.float32).view('<u4')
sys.stdout.buffer.write(h.tobytes() + b.tobytes() + hw.tobytes() + bw.tobytes())
"#;
    let mut child = Command::new(&python)
        .args(["-c", script])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python}: {e}"));
    let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    child.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "the numpy oracle failed");
    let n = values.len();
    let u16s = |b: &[u8]| -> Vec<u16> {
        b.chunks_exact(2)
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    };
    let u32s = |b: &[u8]| -> Vec<u32> {
        b.chunks_exact(4)
            .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    let o = &out.stdout;
    assert_eq!(o.len(), 4 * n + 8 * 65536, "oracle output size");
    (
        u16s(&o[..2 * n]),
        u16s(&o[2 * n..4 * n]),
        u32s(&o[4 * n..4 * n + 4 * 65536]),
        u32s(&o[4 * n + 4 * 65536..]),
    )
}

/// Whether two bit patterns are the same value: equal, or both NaN (numpy keeps NaN
/// payloads differently from one version to the next; smelt's are quiet NaNs).
fn same16(got: u16, want: u16) -> bool {
    let nan = |b: u16, exp: u16| b & exp == exp && b & !(exp | 0x8000) != 0;
    got == want
        || (nan(got, 0x7c00) && nan(want, 0x7c00))
        || (nan(got, 0x7f80) && nan(want, 0x7f80))
}

#[test]
fn conversions_match_numpy_and_ml_dtypes() {
    let values = edge_values();
    let (h, b, hw, bw) = oracle(&values);
    for (k, &x) in values.iter().enumerate() {
        let got = f32_to_f16(x);
        assert!(
            same16(got, h[k]) && (got & 0x8000) == (h[k] & 0x8000),
            "f16 of {x:e} ({:#010x}): smelt {got:#06x}, numpy {:#06x}",
            x.to_bits(),
            h[k]
        );
        let got = f32_to_bf16(x);
        assert!(
            same16(got, b[k]) && (got & 0x8000) == (b[k] & 0x8000),
            "bf16 of {x:e} ({:#010x}): smelt {got:#06x}, ml_dtypes {:#06x}",
            x.to_bits(),
            b[k]
        );
    }
    for bits in 0..=u16::MAX {
        let (g, w) = (f16_to_f32(bits), f32::from_bits(hw[bits as usize]));
        assert!(
            g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
            "f16 {bits:#06x}"
        );
        let (g, w) = (bf16_to_f32(bits), f32::from_bits(bw[bits as usize]));
        assert!(
            g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
            "bf16 {bits:#06x}"
        );
    }
    // bf16 rounds, it does not truncate: 1 + 2^-8 + 2^-20 is above the tie
    let above_tie = 1.0 + f32::powi(2.0, -8) + f32::powi(2.0, -20);
    assert_eq!(
        f32_to_bf16(above_tie),
        (above_tie.to_bits() >> 16) as u16 + 1
    );
}

const CASTS: &str = "func @f(%x: tensor<NxF32>) -> (h: tensor<Nxf16>, b: tensor<Nxbf16>, hw: tensor<Nxf32>, bw: tensor<Nxf32>, hi: tensor<Nxi32>, hb: tensor<Nxi1>, bh: tensor<Nxf16>) {
  %h = cast %x {to = f16} : tensor<Nxf16>
  %b = cast %x {to = bf16} : tensor<Nxbf16>
  %hw = cast %h {to = f32} : tensor<Nxf32>
  %bw = cast %b {to = f32} : tensor<Nxf32>
  %hi = cast %h {to = i32} : tensor<Nxi32>
  %hb = cast %h {to = i1} : tensor<Nxi1>
  %bh = cast %b {to = f16} : tensor<Nxf16>
  return %h, %b, %hw, %bw, %hi, %hb, %bh : tensor<Nxf16>, tensor<Nxbf16>, tensor<Nxf32>, tensor<Nxf32>, tensor<Nxi32>, tensor<Nxi1>, tensor<Nxf16>
}";

fn bits(t: &Tensor) -> Vec<u16> {
    match &t.data {
        TensorData::F16(v) | TensorData::BF16(v) => v.clone(),
        other => panic!("a 2-byte float tensor was expected, got {}", other.dtype()),
    }
}

#[test]
fn jit_cast_kernels_convert_bit_for_bit() {
    // NaN and values out of i32's range saturate in the cast to i32 (ONNX leaves them
    // undefined); the interpreter and the JIT agree on them all the same
    let values: Vec<f32> = edge_values();
    let n = values.len();
    let src = CASTS
        .replace("NxF32", &format!("{n}xf32"))
        .replace("Nx", &format!("{n}x"));
    let m = smelt_ir::text::parse(&src, "casts.tir").unwrap_or_else(|d| panic!("{d}"));
    let x = Tensor::new([n], values.clone()).unwrap();
    let want = interp::run(&m, &m.funcs[0], std::slice::from_ref(&x)).expect("interprets");
    // the interpreter is the Rust conversions
    let h: Vec<u16> = values.iter().map(|&v| f32_to_f16(v)).collect();
    let b: Vec<u16> = values.iter().map(|&v| f32_to_bf16(v)).collect();
    assert!(bits(&want[0]) == h, "the interpreter's f16 casts");
    assert!(bits(&want[1]) == b, "the interpreter's bf16 casts");
    for kernels in jit_util::kernel_choices() {
        let o = smelt::CompileOptions {
            kernels,
            ..jit_util::opts()
        };
        let exe = smelt::Executable::compile(&m, None, &o).expect("compiles");
        let got = exe.run(std::slice::from_ref(&x)).expect("runs");
        assert!(bits(&got[0]) == h, "{kernels:?}: f32 -> f16");
        assert!(bits(&got[1]) == b, "{kernels:?}: f32 -> bf16");
        let widened = |t: &Tensor| -> Vec<u32> { t.f32s().iter().map(|v| v.to_bits()).collect() };
        let hw: Vec<u32> = h.iter().map(|&v| f16_to_f32(v).to_bits()).collect();
        let bw: Vec<u32> = b.iter().map(|&v| bf16_to_f32(v).to_bits()).collect();
        assert!(widened(&got[2]) == hw, "{kernels:?}: f16 -> f32");
        assert!(widened(&got[3]) == bw, "{kernels:?}: bf16 -> f32");
        assert!(got[4].data == want[4].data, "{kernels:?}: f16 -> i32");
        assert!(got[5].data == want[5].data, "{kernels:?}: f16 -> i1");
        assert!(bits(&got[6]) == bits(&want[6]), "{kernels:?}: bf16 -> f16");
    }
    // the whole pipeline (fusion included) computes the same bits (NaNs included, which
    // `==` on tensors would call different)
    let (exe, _) = smelt::compile(&m, &smelt::Options::default()).expect("compiles");
    let got = exe.run(&[x]).expect("runs");
    for (k, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(
            g.ty == w.ty && g.data.to_le_bytes() == w.data.to_le_bytes(),
            "output {k} of the optimized module differs"
        );
    }
}

#[test]
fn two_byte_elements_move_through_transpose_concat_slice_and_pad() {
    let src = "func @f(%a: tensor<2x3xf16>, %b: tensor<2x3xbf16>) -> (t: tensor<3x2xf16>, c: tensor<4x3xf16>, s: tensor<2x2xbf16>, p: tensor<2x5xf16>, w: tensor<2x3xf32>) {
  %t = transpose %a {perm = [1, 0]} : tensor<3x2xf16>
  %c = concat %a, %a {axis = 0} : tensor<4x3xf16>
  %s = slice %b {starts = [0, 1], ends = [2, 3], steps = [1, 1]} : tensor<2x2xbf16>
  %p = pad %a {pads = [0, 1, 0, 1]} : tensor<2x5xf16>
  %w = cast %b {to = f32} : tensor<2x3xf32>
  return %t, %c, %s, %p, %w : tensor<3x2xf16>, tensor<4x3xf16>, tensor<2x2xbf16>, tensor<2x5xf16>, tensor<2x3xf32>
}";
    let m = smelt_ir::text::parse(src, "moves.tir").unwrap_or_else(|d| panic!("{d}"));
    let a = Tensor::random(&smelt_ir::TensorType::new(DType::F16, [2, 3]), 1);
    let b = Tensor::random(&smelt_ir::TensorType::new(DType::BF16, [2, 3]), 2);
    let got = jit_util::check_against_interp("moves", &m, &[a.clone(), b.clone()], 0.0);
    let (ab, bb) = (bits(&a), bits(&b));
    assert_eq!(
        bits(&got[0]),
        vec![ab[0], ab[3], ab[1], ab[4], ab[2], ab[5]]
    );
    assert_eq!(bits(&got[1]), [ab.clone(), ab.clone()].concat());
    assert_eq!(bits(&got[2]), vec![bb[1], bb[2], bb[4], bb[5]]);
    assert_eq!(
        bits(&got[3]),
        vec![0, ab[0], ab[1], ab[2], 0, 0, ab[3], ab[4], ab[5], 0]
    );
    let widened: Vec<f32> = bb.iter().map(|&v| bf16_to_f32(v)).collect();
    assert_eq!(got[4].f32s(), widened.as_slice());
}

#[test]
fn npy_files_hold_float16_as_f2_and_bfloat16_as_v2() {
    for dtype in [DType::F16, DType::BF16] {
        let t = Tensor::random(&smelt_ir::TensorType::new(dtype, [2, 3]), 5);
        let bytes = smelt::npy::encode(&t);
        let descr = if dtype == DType::F16 {
            "'<f2'"
        } else {
            "'<V2'"
        };
        assert!(
            String::from_utf8_lossy(&bytes[..64]).contains(descr),
            "{dtype}"
        );
        assert_eq!(smelt::npy::decode(&bytes).unwrap(), t, "{dtype}");
    }
}

#[test]
fn text_weights_of_f16_and_bf16_round_to_the_type_and_print_back_exactly() {
    let src = "const @h : tensor<3xf16> = dense<[1.0, 0.1, -2.5]>
const @b : tensor<2xbf16> = dense<[0.1, 3.0]>
func @f() -> (h: tensor<3xf16>, b: tensor<2xbf16>) {
  %h = const @h : tensor<3xf16>
  %b = const @b : tensor<2xbf16>
  return %h, %b : tensor<3xf16>, tensor<2xbf16>
}";
    let m = smelt_ir::text::parse(src, "w.tir").unwrap_or_else(|d| panic!("{d}"));
    let got = interp::run(&m, &m.funcs[0], &[]).expect("interprets");
    assert_eq!(bits(&got[0]), vec![0x3c00, f32_to_f16(0.1), 0xc100]);
    assert_eq!(bits(&got[1]), vec![f32_to_bf16(0.1), 0x4040]);
    let printed = smelt_ir::text::print(&m, &Default::default());
    let again = smelt_ir::text::parse(&printed, "printed.tir").unwrap_or_else(|d| panic!("{d}"));
    assert_eq!(smelt_ir::text::print(&again, &Default::default()), printed);
    let got_again = interp::run(&again, &again.funcs[0], &[]).expect("interprets");
    assert!(got_again == got, "the printed module computes the same");
}

#[test]
fn arithmetic_on_f16_is_a_type_error_naming_the_op() {
    let src = "func @f(%a: tensor<2xf16>) -> (y: tensor<2xf16>) {
  %y = add %a, %a : tensor<2xf16>
  return %y : tensor<2xf16>
}";
    // the parser checks types as it reads, or the verifier does: either names the op
    let err = match smelt_ir::text::parse(src, "add.tir") {
        Err(d) => d.to_string(),
        Ok(m) => smelt_ir::verify::verify_module(&m)
            .expect_err("add on f16 is refused")
            .to_string(),
    };
    assert!(err.contains("add") && err.contains("f16"), "{err}");
}

#[test]
fn the_c_api_runs_f16_and_bf16_buffers_of_their_element_types() {
    use smelt::capi::{smelt_executable_destroy, SmeltElementType, SmeltStatus};
    let src = "func @f(%h: tensor<4xf16>) -> (b: tensor<4xbf16>) {
  %w = cast %h {to = f32} : tensor<4xf32>
  %b = cast %w {to = bf16} : tensor<4xbf16>
  return %b : tensor<4xbf16>
}";
    let (exe, input, output) = jit_util::capi_from_text(src);
    assert_eq!(
        (input.element_type, output.element_type),
        (SmeltElementType::F16, SmeltElementType::BF16)
    );
    // 1, 0.1 (as f16), 65504 and -inf
    let mut h: [u16; 4] = [0x3c00, f32_to_f16(0.1), 0x7bff, 0xfc00];
    let mut b = [0u16; 4];
    let run = |x: &mut [_; 4], y: &mut [_; 4], ty: SmeltElementType| {
        jit_util::capi_run_one(exe, x, ty, y, SmeltElementType::BF16)
    };
    assert_eq!(run(&mut h, &mut b, SmeltElementType::F16), SmeltStatus::Ok);
    let want: Vec<u16> = h.iter().map(|&x| f32_to_bf16(f16_to_f32(x))).collect();
    assert_eq!(b.to_vec(), want);
    // bf16 bits where the tensor is f16: refused, not reinterpreted
    assert_eq!(
        run(&mut h, &mut b, SmeltElementType::BF16),
        SmeltStatus::InvalidArgument
    );
    assert_eq!(smelt_executable_destroy(exe), SmeltStatus::Ok);
}

#[test]
fn gather_where_expand_tile_and_reflect_pads_move_2_byte_elements() {
    let src = "func @f(%a: tensor<3x2xbf16>, %ids: tensor<4xi64>, %c: tensor<3x2xi1>, %b: tensor<3x2xbf16>) -> (g: tensor<4x2xbf16>, w: tensor<3x2xbf16>, e: tensor<2x3x2xbf16>, t: tensor<3x4xbf16>, r: tensor<3x4xbf16>) {
  %g = gather %a, %ids {axis = 0} : tensor<4x2xbf16>
  %w = where %c, %a, %b : tensor<3x2xbf16>
  %e = expand %a {shape = [2, 3, 2]} : tensor<2x3x2xbf16>
  %t = tile %a {repeats = [1, 2]} : tensor<3x4xbf16>
  %r = pad %a {pads = [0, 1, 0, 1], mode = reflect} : tensor<3x4xbf16>
  return %g, %w, %e, %t, %r : tensor<4x2xbf16>, tensor<3x2xbf16>, tensor<2x3x2xbf16>, tensor<3x4xbf16>, tensor<3x4xbf16>
}";
    let m = smelt_ir::text::parse(src, "moves.tir").unwrap_or_else(|d| panic!("{d}"));
    let a = Tensor::random(&smelt_ir::TensorType::new(DType::BF16, [3, 2]), 3);
    let b = Tensor::random(&smelt_ir::TensorType::new(DType::BF16, [3, 2]), 4);
    let ids = Tensor::typed([4], vec![2i64, 0, -1, 1]).unwrap();
    let c = Tensor::typed([3, 2], vec![true, false, false, true, true, false]).unwrap();
    let got = jit_util::check_against_interp("moves", &m, &[a.clone(), ids, c, b.clone()], 0.0);
    let (x, y) = (bits(&a), bits(&b));
    assert_eq!(
        bits(&got[0]),
        vec![x[4], x[5], x[0], x[1], x[4], x[5], x[2], x[3]]
    );
    assert_eq!(bits(&got[1]), vec![x[0], y[1], y[2], x[3], x[4], y[5]]);
    assert_eq!(bits(&got[2]), [x.clone(), x.clone()].concat());
    assert_eq!(bits(&got[3])[..4], [x[0], x[1], x[0], x[1]]);
    assert_eq!(bits(&got[4])[..4], [x[1], x[0], x[1], x[0]]);
}

#[test]
fn onnx_float16_nodes_compute_in_f32_between_casts_whatever_the_tensor_names() {
    use onnx_build::{fixed, Model};
    // a tensor named as the importer's widenings are: the widening of x takes another name
    let m = Model::new(17)
        .input_dims("x", 10, &fixed(&[4]))
        .node("Identity", "id", &["x"], &["x (as float32)"], vec![])
        .node("Mul", "mul", &["x", "x (as float32)"], &["y"], vec![])
        .node("Sqrt", "sqrt", &["y"], &["r"], vec![])
        .output("y")
        .output("r")
        .import()
        .unwrap_or_else(|e| panic!("{e}"));
    let f = &m.funcs[0];
    let types: Vec<DType> = f.results.iter().map(|r| f.type_of(r.value).dtype).collect();
    assert_eq!(types, [DType::F16, DType::F16]);
    // every computation is on f32: the only ops that touch f16 are casts
    for inst in &f.insts {
        let reads_f16 = inst
            .operands
            .iter()
            .any(|&v| f.type_of(v).dtype == DType::F16);
        assert!(
            !reads_f16 || matches!(inst.op, smelt_ir::Op::Cast { .. }),
            "{:?} reads f16",
            inst.op
        );
    }
    // 3 · 3 rounds exactly; 1.1² rounds once from the f32 product, as numpy's f16 does
    let x: Vec<u16> = [3.0f32, 1.1, -0.5, 300.0]
        .iter()
        .map(|&v| f32_to_f16(v))
        .collect();
    let got = interp::run(
        &m,
        f,
        &[Tensor::typed([4], TensorData::F16(x.clone())).unwrap()],
    )
    .expect("interprets");
    let want: Vec<u16> = x
        .iter()
        .map(|&h| f32_to_f16(f16_to_f32(h) * f16_to_f32(h)))
        .collect();
    assert_eq!(bits(&got[0]), want);
    assert_eq!(bits(&got[0])[3], 0x7c00, "300² overflows f16 to infinity");
    let roots: Vec<u16> = want
        .iter()
        .map(|&h| f32_to_f16(f16_to_f32(h).sqrt()))
        .collect();
    assert_eq!(bits(&got[1]), roots);
}
