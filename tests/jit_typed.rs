//! Integer and i1 tensors through the whole compiler (fusion, lowering, JIT): exact
//! integer arithmetic far above 2^24, the ONNX cast rules, comparisons, logic, bitwise
//! operators and shifts at every edge amount, `where`,
//! data movement on every element type, and `gather`, whose out-of-range index is an
//! error from `run` (Rust) and an error status (C), never a read outside the table.

mod jit_util;

use jit_util::{check_against_interp, kernel_choices, opts};
use smelt::capi::{
    smelt_executable_destroy, smelt_executable_run, smelt_executable_run_typed, smelt_last_error,
    SmeltBuffer, SmeltElementType, SmeltStatus,
};
use smelt::{CompileOptions, Error, Executable};
use smelt_ir::{interp, Module, Tensor, TensorData};

fn parse(src: &str) -> Module {
    smelt_ir::text::parse(src, "typed.tir").unwrap_or_else(|d| panic!("{d}"))
}

/// Runs the module through the interpreter and every kernel choice, checks they agree
/// exactly, and returns the JIT's outputs.
fn run_exact(what: &str, src: &str, inputs: &[Tensor]) -> Vec<Tensor> {
    let m = parse(src);
    let got = check_against_interp(what, &m, inputs, 0.0);
    let (exe, _) = smelt::compile(&m, &smelt::Options::default()).expect("compiles fused");
    let fused = exe.run(inputs).expect("runs fused");
    assert_eq!(fused, got, "{what}: the fused module computes the same");
    got
}

fn ints(t: &Tensor) -> Vec<i64> {
    t.data.to_i64s().expect("an integer tensor")
}

#[test]
fn int64_arithmetic_far_above_2_24_is_exact() {
    let a = vec![(1i64 << 40) + 1, -(3i64.pow(30)), i64::MAX, i64::MIN, 7, -7];
    let b = vec![3i64, 1 << 20, 1, -1, -2, 2];
    let src = "func @f(%a: tensor<6xi64>, %b: tensor<6xi64>) -> (s: tensor<6xi64>, d: tensor<6xi64>, p: tensor<6xi64>, q: tensor<6xi64>, lo: tensor<6xi64>, hi: tensor<6xi64>, n: tensor<6xi64>, m: tensor<6xi64>) {
  %s = add %a, %b : tensor<6xi64>
  %d = sub %a, %b : tensor<6xi64>
  %p = mul %a, %b : tensor<6xi64>
  %q = div %a, %b : tensor<6xi64>
  %lo = min %a, %b : tensor<6xi64>
  %hi = max %a, %b : tensor<6xi64>
  %n = neg %a : tensor<6xi64>
  %m = abs %a : tensor<6xi64>
  return %s, %d, %p, %q, %lo, %hi, %n, %m : tensor<6xi64>, tensor<6xi64>, tensor<6xi64>, tensor<6xi64>, tensor<6xi64>, tensor<6xi64>, tensor<6xi64>, tensor<6xi64>
}";
    let inputs = [
        Tensor::typed([6], a.clone()).unwrap(),
        Tensor::typed([6], b.clone()).unwrap(),
    ];
    let got = run_exact("i64 arithmetic", src, &inputs);
    let each =
        |f: fn(i64, i64) -> i64| -> Vec<i64> { a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect() };
    assert_eq!(ints(&got[0]), each(i64::wrapping_add));
    assert_eq!(ints(&got[1]), each(i64::wrapping_sub));
    assert_eq!(ints(&got[2]), each(i64::wrapping_mul));
    // truncating toward zero; MIN / -1 wraps instead of trapping
    assert_eq!(ints(&got[3]), each(i64::wrapping_div));
    assert_eq!(ints(&got[4]), each(i64::min));
    assert_eq!(ints(&got[5]), each(i64::max));
    assert_eq!(
        ints(&got[6]),
        a.iter().map(|v| v.wrapping_neg()).collect::<Vec<_>>()
    );
    assert_eq!(
        ints(&got[7]),
        a.iter().map(|v| v.wrapping_abs()).collect::<Vec<_>>()
    );
    // 2^40 + 1 + 3 is not an f32: it survived exactly
    assert_eq!(ints(&got[0])[0], (1 << 40) + 4);
}

#[test]
fn integer_division_by_zero_is_an_error_not_a_trap() {
    let src = "func @f(%a: tensor<3xi32>, %b: tensor<3xi32>) -> (q: tensor<3xi32>) {
  %q = div %a, %b : tensor<3xi32>
  return %q : tensor<3xi32>
}";
    let m = parse(src);
    let inputs = [
        Tensor::typed([3], vec![6i32, 7, 8]).unwrap(),
        Tensor::typed([3], vec![2i32, 0, 4]).unwrap(),
    ];
    let interp_err = interp::run(&m, &m.funcs[0], &inputs)
        .unwrap_err()
        .to_string();
    assert!(interp_err.contains("division by zero"), "{interp_err}");
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    match exe.run(&inputs) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains("division by zero"), "{msg}")
        }
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
}

#[test]
fn mod_takes_the_divisors_sign_or_with_fmod_the_dividends() {
    let a = vec![7i64, -7, 7, -7, i64::MIN, i64::MAX, (1i64 << 50) + 3, 0];
    let b = vec![3i64, 3, -3, -3, -1, -(1 << 40), 1 << 20, -5];
    let src = "func @f(%a: tensor<8xi64>, %b: tensor<8xi64>, %c: tensor<2x1xi64>) -> (m: tensor<8xi64>, f: tensor<8xi64>, bm: tensor<2x8xi64>) {
  %m = mod %a, %b : tensor<8xi64>
  %f = mod %a, %b {fmod = true} : tensor<8xi64>
  %bm = mod %a, %c : tensor<2x8xi64>
  return %m, %f, %bm : tensor<8xi64>, tensor<8xi64>, tensor<2x8xi64>
}";
    let inputs = [
        Tensor::typed([8], a.clone()).unwrap(),
        Tensor::typed([8], b.clone()).unwrap(),
        Tensor::typed([2, 1], vec![4i64, -4]).unwrap(),
    ];
    let got = run_exact("i64 mod", src, &inputs);
    // Python's remainder: the truncated one moved by the divisor when the signs differ
    let python = |x: i64, y: i64| {
        let r = x.wrapping_rem(y);
        if r != 0 && (r < 0) != (y < 0) {
            r + y
        } else {
            r
        }
    };
    let each = |f: &dyn Fn(i64, i64) -> i64| -> Vec<i64> {
        a.iter().zip(&b).map(|(&x, &y)| f(x, y)).collect()
    };
    assert_eq!(ints(&got[0]), each(&python));
    assert_eq!(ints(&got[0])[..4], [1, 2, -2, -1]);
    assert_eq!(ints(&got[1]), each(&|x, y| x.wrapping_rem(y)));
    assert_eq!(ints(&got[1])[..4], [1, -1, 1, -1]);
    let by_row: Vec<i64> = [4i64, -4]
        .iter()
        .flat_map(|&y| a.iter().map(move |&x| python(x, y)))
        .collect();
    assert_eq!(ints(&got[2]), by_row);

    // C's fmod on f32: the dividend's sign (exact for these quotients)
    let src = "func @f(%a: tensor<4xf32>, %b: tensor<4xf32>) -> (f: tensor<4xf32>) {
  %f = mod %a, %b {fmod = true} : tensor<4xf32>
  return %f : tensor<4xf32>
}";
    let (x, y) = (
        vec![5.5f32, -7.25, 7.25, -0.5],
        vec![2.0f32, 2.5, -2.5, 3.0],
    );
    let inputs = [
        Tensor::typed([4], x.clone()).unwrap(),
        Tensor::typed([4], y.clone()).unwrap(),
    ];
    let got = check_against_interp("f32 fmod", &parse(src), &inputs, 0.0);
    let want: Vec<f32> = x.iter().zip(&y).map(|(p, q)| p % q).collect();
    assert_eq!(got[0].f32s(), want.as_slice());
}

#[test]
fn integer_mod_by_zero_is_an_error_and_float_mod_needs_fmod() {
    let src = "func @f(%a: tensor<3xi32>, %b: tensor<3xi32>) -> (m: tensor<3xi32>) {
  %m = mod %a, %b : tensor<3xi32>
  return %m : tensor<3xi32>
}";
    let m = parse(src);
    let inputs = [
        Tensor::typed([3], vec![6i32, 7, 8]).unwrap(),
        Tensor::typed([3], vec![2i32, 0, 4]).unwrap(),
    ];
    let interp_err = interp::run(&m, &m.funcs[0], &inputs)
        .unwrap_err()
        .to_string();
    assert!(interp_err.contains("remainder by zero"), "{interp_err}");
    let exe = Executable::compile(&m, None, &opts()).expect("compiles");
    match exe.run(&inputs) {
        Err(Error::InvalidArgument(msg)) => {
            assert!(msg.contains("division by zero"), "{msg}")
        }
        other => panic!("expected an invalid-argument error, got {other:?}"),
    }
    let src = "func @f(%a: tensor<3xf32>, %b: tensor<3xf32>) -> (m: tensor<3xf32>) {
  %m = mod %a, %b : tensor<3xf32>
  return %m : tensor<3xf32>
}";
    let e = smelt_ir::text::parse(src, "typed.tir")
        .unwrap_err()
        .to_string();
    assert!(e.contains("needs fmod = true"), "{e}");
}

#[test]
fn casts_follow_the_onnx_rules() {
    let src = "func @f(%x: tensor<8xf32>, %i: tensor<4xi64>) -> (a: tensor<8xi64>, b: tensor<8xi32>, c: tensor<8xi1>, d: tensor<4xf32>, e: tensor<4xi32>, g: tensor<4xf32>) {
  %a = cast %x {to = i64} : tensor<8xi64>
  %b = cast %x {to = i32} : tensor<8xi32>
  %c = cast %x {to = i1} : tensor<8xi1>
  %d = cast %i {to = f32} : tensor<4xf32>
  %e = cast %i {to = i32} : tensor<4xi32>
  %t = cast %i {to = i1} : tensor<4xi1>
  %g = cast %t {to = f32} : tensor<4xf32>
  return %a, %b, %c, %d, %e, %g : tensor<8xi64>, tensor<8xi32>, tensor<8xi1>, tensor<4xf32>, tensor<4xi32>, tensor<4xf32>
}";
    let x = vec![
        1.9f32,
        -1.9,
        f32::NAN,
        1e20,
        -1e20,
        f32::INFINITY,
        0.0,
        -0.5,
    ];
    let i = vec![(1i64 << 24) + 1, (1i64 << 32) + 5, -1, 0];
    let inputs = [
        Tensor::new([8], x.clone()).unwrap(),
        Tensor::typed([4], i).unwrap(),
    ];
    let got = run_exact("casts", src, &inputs);
    // float to integer truncates toward zero and saturates; NaN becomes 0
    assert_eq!(
        ints(&got[0]),
        vec![1, -1, 0, i64::MAX, i64::MIN, i64::MAX, 0, 0]
    );
    let i32s = [1, -1, 0, i32::MAX, i32::MIN, i32::MAX, 0, 0].map(i64::from);
    assert_eq!(ints(&got[1]), i32s);
    // to i1: != 0, NaN true
    assert_eq!(
        got[2].data,
        TensorData::Bool(vec![true, true, true, true, true, true, false, true])
    );
    // integer to float rounds to nearest even: 2^24 + 1 -> 2^24
    assert_eq!(got[3].f32s(), [16_777_216.0, 4_294_967_296.0, -1.0, 0.0]);
    // integer to integer wraps
    assert_eq!(ints(&got[4]), vec![1 + (1 << 24), 5, -1, 0]);
    assert_eq!(got[5].f32s(), [1.0, 1.0, 1.0, 0.0]);
}

#[test]
fn comparisons_logic_and_where_on_every_type() {
    let src = "func @f(%x: tensor<2x3xf32>, %y: tensor<3xf32>, %i: tensor<2x3xi64>, %j: tensor<2x1xi64>) -> (lt: tensor<2x3xi1>, eq: tensor<2x3xi1>, ge: tensor<2x3xi1>, mix: tensor<2x3xi1>, w: tensor<2x3xf32>, wi: tensor<2x3xi64>) {
  %lt = less %x, %y : tensor<2x3xi1>
  %eq = equal %i, %j : tensor<2x3xi1>
  %ge = greater_equal %i, %j : tensor<2x3xi1>
  %gt = greater %x, %y : tensor<2x3xi1>
  %le = less_equal %i, %j : tensor<2x3xi1>
  %a = and %gt, %le : tensor<2x3xi1>
  %o = xor %a, %eq : tensor<2x3xi1>
  %mix = not %o : tensor<2x3xi1>
  %w = where %lt, %x, %y : tensor<2x3xf32>
  %wi = where %eq, %i, %j : tensor<2x3xi64>
  return %lt, %eq, %ge, %mix, %w, %wi : tensor<2x3xi1>, tensor<2x3xi1>, tensor<2x3xi1>, tensor<2x3xi1>, tensor<2x3xf32>, tensor<2x3xi64>
}";
    let inputs = [
        Tensor::new([2, 3], vec![0.5, -1.0, f32::NAN, 2.0, 0.0, 3.0]).unwrap(),
        Tensor::new([3], vec![1.0, -1.0, 0.0]).unwrap(),
        Tensor::typed([2, 3], vec![1i64 << 50, 2, 3, 4, 5, 6]).unwrap(),
        Tensor::typed([2, 1], vec![2i64, 5]).unwrap(),
    ];
    let got = run_exact("compare", src, &inputs);
    let b = |v: [bool; 6]| TensorData::Bool(v.to_vec());
    assert_eq!(got[0].data, b([true, false, false, false, false, false]));
    assert_eq!(got[1].data, b([false, true, false, false, true, false]));
    assert_eq!(got[2].data, b([true, true, true, false, true, true]));
    // where picks whole values of either type
    assert_eq!(got[4].f32s()[0], 0.5);
    assert_eq!(ints(&got[5]), vec![2, 2, 2, 5, 5, 5]);
}

/// The ONNX BitShift result of `a` shifted by `b` in a signed type of `bits` bits,
/// written out independently of the compiler's `eval_int`.
fn shifted(a: i64, b: i64, left: bool, bits: u32) -> i64 {
    let wrap = |v: i64| {
        if bits == 64 {
            v
        } else {
            (v << (64 - bits)) >> (64 - bits)
        }
    };
    match (left, (0..i64::from(bits)).contains(&b)) {
        (true, true) => wrap(((a as u64) << b) as i64),
        (true, false) => 0,
        (false, true) => a >> b,
        (false, false) => {
            if a < 0 {
                -1
            } else {
                0
            }
        }
    }
}

#[test]
fn bitwise_operators_and_shifts_on_integers_at_every_edge_amount() {
    for (ty, bits) in [("i64", 64u32), ("i32", 32)] {
        let src = format!(
            "func @f(%a: tensor<12x{ty}>, %b: tensor<12x{ty}>) -> (l: tensor<12x{ty}>, r: tensor<12x{ty}>, n: tensor<12x{ty}>, x: tensor<12x{ty}>) {{
  %l = shift_left %a, %b : tensor<12x{ty}>
  %r = shift_right %a, %b : tensor<12x{ty}>
  %and = and %a, %b : tensor<12x{ty}>
  %or = or %and, %b : tensor<12x{ty}>
  %x = xor %or, %a : tensor<12x{ty}>
  %n = not %a : tensor<12x{ty}>
  return %l, %r, %n, %x : tensor<12x{ty}>, tensor<12x{ty}>, tensor<12x{ty}>, tensor<12x{ty}>
}}"
        );
        let big = if bits == 64 {
            -(1i64 << 62) - 5
        } else {
            -(1i64 << 30) - 5
        };
        let a = [1, -1, 5, -8, big, 3, -3, 7, i64::from(i32::MAX), 9, -9, 1];
        let w = i64::from(bits);
        let b = [0, 1, w - 1, w - 1, 1, w, w, -1, 1, 3, 3, w + 1];
        let tensor = |v: &[i64]| match bits {
            64 => Tensor::typed([12], v.to_vec()).unwrap(),
            _ => Tensor::typed([12], v.iter().map(|&e| e as i32).collect::<Vec<_>>()).unwrap(),
        };
        let got = run_exact(&format!("bitwise {ty}"), &src, &[tensor(&a), tensor(&b)]);
        let want_left: Vec<i64> = a
            .iter()
            .zip(&b)
            .map(|(&p, &q)| shifted(p, q, true, bits))
            .collect();
        let want_right: Vec<i64> = a
            .iter()
            .zip(&b)
            .map(|(&p, &q)| shifted(p, q, false, bits))
            .collect();
        let narrow = |v: i64| if bits == 64 { v } else { i64::from(v as i32) };
        assert_eq!(ints(&got[0]), want_left, "{ty} shift_left");
        assert_eq!(ints(&got[1]), want_right, "{ty} shift_right");
        assert_eq!(
            ints(&got[2]),
            a.iter().map(|&v| narrow(!v)).collect::<Vec<_>>(),
            "{ty} not"
        );
        let mixed: Vec<i64> = a
            .iter()
            .zip(&b)
            .map(|(&p, &q)| narrow(((p & q) | q) ^ p))
            .collect();
        assert_eq!(ints(&got[3]), mixed, "{ty} and/or/xor");
    }
}

#[test]
fn data_movement_keeps_every_element_type() {
    let src = "func @f(%i: tensor<2x3xi64>, %b: tensor<2x3xi1>, %n: tensor<3xi32>) -> (t: tensor<3x2xi64>, s: tensor<2x2xi64>, c: tensor<4x3xi64>, e: tensor<2x2x3xi1>, r: tensor<6xi1>, k: tensor<6xi32>) {
  %t = transpose %i {perm = [1, 0]} : tensor<3x2xi64>
  %s = slice %i {starts = [0, 2], ends = [2, -1], steps = [1, -2]} : tensor<2x2xi64>
  %c = concat %i, %i {axis = 0} : tensor<4x3xi64>
  %e = expand %b {shape = [2, 2, 3]} : tensor<2x2x3xi1>
  %r = reshape %b {shape = [6]} : tensor<6xi1>
  %k = tile %n {repeats = [2]} : tensor<6xi32>
  return %t, %s, %c, %e, %r, %k : tensor<3x2xi64>, tensor<2x2xi64>, tensor<4x3xi64>, tensor<2x2x3xi1>, tensor<6xi1>, tensor<6xi32>
}";
    let big = 1i64 << 45;
    let inputs = [
        Tensor::typed([2, 3], vec![big, big + 1, big + 2, -big, 7, 8]).unwrap(),
        Tensor::typed([2, 3], vec![true, false, true, false, false, true]).unwrap(),
        Tensor::typed([3], vec![i32::MIN, 0, i32::MAX]).unwrap(),
    ];
    let got = run_exact("movement", src, &inputs);
    assert_eq!(ints(&got[0]), vec![big, -big, big + 1, 7, big + 2, 8]);
    assert_eq!(ints(&got[1]), vec![big + 2, big, 8, -big]);
    assert_eq!(ints(&got[2])[3..6], [-big, 7, 8]);
    assert_eq!(got[3].dtype(), smelt_ir::DType::Bool);
    assert_eq!(
        ints(&got[5]),
        [i32::MIN, 0, i32::MAX, i32::MIN, 0, i32::MAX].map(i64::from)
    );
}

const EMBEDDING: &str =
    "const @table : tensor<4x2xf32> = dense<[0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5]>
func @embed(%ids: tensor<2x3xi64>) -> (e: tensor<2x3x2xf32>) {
  %t = const @table : tensor<4x2xf32>
  %e = gather %t, %ids : tensor<2x3x2xf32>
  return %e : tensor<2x3x2xf32>
}";

#[test]
fn gather_reads_by_run_time_ids_and_refuses_one_out_of_range() {
    let ids = Tensor::typed([2, 3], vec![0i64, 3, -1, 2, -4, 1]).unwrap();
    let got = run_exact("gather", EMBEDDING, &[ids]);
    assert_eq!(
        got[0].f32s(),
        [0.0, 0.5, 3.0, 3.5, 3.0, 3.5, 2.0, 2.5, 0.0, 0.5, 1.0, 1.5]
    );
    let m = parse(EMBEDDING);
    for bad in [4i64, -5, i64::MAX, i64::MIN] {
        let ids = Tensor::typed([2, 3], vec![0, 1, bad, 2, 3, 0]).unwrap();
        let e = interp::run(&m, &m.funcs[0], std::slice::from_ref(&ids))
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range"), "interpreter, index {bad}: {e}");
        for kernels in kernel_choices() {
            let o = CompileOptions { kernels, ..opts() };
            let exe = Executable::compile(&m, None, &o).expect("compiles");
            match exe.run(std::slice::from_ref(&ids)) {
                Err(Error::InvalidArgument(msg)) => {
                    assert!(
                        msg.contains("out of range") && msg.contains("gather"),
                        "{msg}"
                    )
                }
                other => panic!("index {bad}: expected an error, got {other:?}"),
            }
            // the executable stays usable
            let good = Tensor::typed([2, 3], vec![0i64; 6]).unwrap();
            assert!(exe.run(&[good]).is_ok());
        }
    }
}

#[test]
fn the_c_api_reports_element_types_and_checks_them() {
    let (exe, input, output) = jit_util::capi_from_text(EMBEDDING);
    assert_eq!(input.element_type, SmeltElementType::I64);
    assert_eq!(input.element_count, 6);
    assert_eq!(output.element_type, SmeltElementType::F32);

    let mut ids = [0i64, 3, -1, 2, -4, 1];
    let mut out = [0f32; 12];
    let buffers = |ids: &mut [i64; 6], out: &mut [f32; 12], ty: i32| {
        (
            SmeltBuffer {
                data: ids.as_mut_ptr().cast(),
                element_count: 6,
                element_type: ty,
            },
            SmeltBuffer {
                data: out.as_mut_ptr().cast(),
                element_count: 12,
                element_type: SmeltElementType::F32 as i32,
            },
        )
    };
    let last = || {
        // SAFETY: never NULL, valid until the next call.
        unsafe { std::ffi::CStr::from_ptr(smelt_last_error()) }
            .to_string_lossy()
            .into_owned()
    };
    let (i, o) = buffers(&mut ids, &mut out, SmeltElementType::I64 as i32);
    // SAFETY: the buffers are live for their lengths.
    let s = unsafe { smelt_executable_run_typed(exe, &i, 1, &o, 1) };
    assert_eq!(s, SmeltStatus::Ok);
    assert_eq!(out[2..4], [3.0, 3.5]);
    // the caller says i32 where the tensor is i64; an unknown type value
    for (ty, want) in [
        (SmeltElementType::I32 as i32, "i64"),
        (99, "not a SmeltElementType"),
    ] {
        let (i, o) = buffers(&mut ids, &mut out, ty);
        // SAFETY: as above.
        let s = unsafe { smelt_executable_run_typed(exe, &i, 1, &o, 1) };
        assert_eq!(s, SmeltStatus::InvalidArgument);
        assert!(last().contains(want), "{}", last());
    }
    // the float-only entry refuses an executable with an integer input
    let (ptr, len) = (ids.as_ptr().cast::<f32>(), 6usize);
    let (optr, olen) = (out.as_mut_ptr(), 12usize);
    // SAFETY: the arrays hold one pointer and one length each.
    let s = unsafe { smelt_executable_run(exe, &ptr, &len, 1, &optr, &olen, 1) };
    assert_eq!(s, SmeltStatus::InvalidArgument);
    assert!(last().contains("smelt_executable_run_typed"), "{}", last());
    // an id outside the table is an error status, and nothing is read outside it
    ids[4] = 4;
    let (i, o) = buffers(&mut ids, &mut out, SmeltElementType::I64 as i32);
    // SAFETY: as above.
    let s = unsafe { smelt_executable_run_typed(exe, &i, 1, &o, 1) };
    assert_eq!(s, SmeltStatus::InvalidArgument);
    assert!(last().contains("out of range"), "{}", last());
    assert_eq!(smelt_executable_destroy(exe), SmeltStatus::Ok);
}

/// A chain of typed maps is one kernel: each producer used once by a typed map of the
/// same shape is computed in its consumer's loop. The attention guard after a softmax,
/// `where(not(equal(p, p)), 0, p)` (ONNX IsNaN, Where), becomes one select on f32x4
/// lanes that replaces exactly the NaNs; a comparison against a broadcast row selects on
/// vectors too; a mask chain into `and`/`not` stays scalar; a producer read twice keeps
/// its own kernel. Every form agrees exactly with the interpreter, odd lengths (vector
/// main loop and scalar tail) included.
#[test]
fn typed_chains_run_in_their_consumers_kernel() {
    let src = "const @zero : tensor<f32> = dense<0.0>
func @f(%p: tensor<3x7xf32>, %row: tensor<7xf32>, %i: tensor<3x7xi64>) -> (guard: tensor<3x7xf32>, pick: tensor<3x7xf32>, mask: tensor<3x7xi1>, twice: tensor<3x7xi1>) {
  %z = const @zero : tensor<f32>
  %e = equal %p, %p : tensor<3x7xi1>
  %nan = not %e : tensor<3x7xi1>
  %guard = where %nan, %z, %p : tensor<3x7xf32>
  %lt = less %p, %row : tensor<3x7xi1>
  %pick = where %lt, %p, %row : tensor<3x7xf32>
  %c = cast %p {to = i64} : tensor<3x7xi64>
  %g = greater %c, %i : tensor<3x7xi1>
  %k = less_equal %i, %c : tensor<3x7xi1>
  %both = and %g, %k : tensor<3x7xi1>
  %mask = not %both : tensor<3x7xi1>
  %shared = greater_equal %p, %row : tensor<3x7xi1>
  %twice = xor %shared, %shared : tensor<3x7xi1>
  return %guard, %pick, %mask, %twice : tensor<3x7xf32>, tensor<3x7xf32>, tensor<3x7xi1>, tensor<3x7xi1>
}";
    let mut p: Vec<f32> = (0..21).map(|k| (k as f32 - 10.0) * 0.75).collect();
    p[2] = f32::NAN;
    p[8] = f32::NAN;
    p[20] = f32::NAN;
    p[5] = f32::NEG_INFINITY;
    let inputs = [
        Tensor::new([3, 7], p.clone()).unwrap(),
        Tensor::new([7], vec![0.0, -3.0, 1.5, 2.0, -0.5, 4.0, 0.25]).unwrap(),
        Tensor::typed([3, 7], (0..21).map(|k| k as i64 - 8).collect::<Vec<_>>()).unwrap(),
    ];
    let got = run_exact("typed chains", src, &inputs);
    let guard = got[0].f32s();
    for (k, (&g, &x)) in guard.iter().zip(&p).enumerate() {
        let want = if x.is_nan() { 0.0 } else { x };
        assert_eq!(g.to_bits(), want.to_bits(), "guard element {k}");
    }
    let m = parse(src);
    let prog = smelt_passes::lower::lower(&m, &m.funcs[0]).expect("lowers");
    let loops = prog.dump_loops();
    for kernel in [
        "@where_not_equal_3x7",
        "@where_less_3x7",
        "@not_and_greater_less_equal_3x7",
    ] {
        assert!(loops.contains(kernel), "no {kernel} in:\n{loops}");
    }
    // the guard and the broadcast pick select on vectors (3 × 7 = 21: 5 quads and a tail)
    assert_eq!(loops.matches("store.f32x4").count(), 2, "{loops}");
    // read twice: their own kernels (the cast feeds two comparisons)
    for kernel in ["@greater_equal_3x7", "@cast_i64_3x7", "@xor_3x7"] {
        assert!(loops.contains(kernel), "no {kernel} in:\n{loops}");
    }
}
