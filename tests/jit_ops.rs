//! Every op through the JIT against the interpreter, on small random shapes with odd sizes
//! (not multiples of 4, so vector tails run), including fused ops on every anchor kind.

mod jit_util;

use jit_util::{check_against_interp, f32t, random_inputs};
use smelt_ir::builder::FuncBuilder;
use smelt_ir::op::{
    ConvTranspose2dAttrs, FusedOp, GeluApproximation, GemmAttrs, Pool2dAttrs, PostOp, SliceAttrs,
};
use smelt_ir::weights::random_f32;
use smelt_ir::{BinaryOp, Layout, Module, Op, TensorType, UnaryOp, Value, F32};

/// A one-op function over parameters of the given types (constants where `consts` says).
fn one_op(op: Op, params: &[TensorType], consts: &[(usize, TensorType)]) -> Module {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let mut operands: Vec<Option<Value>> = vec![None; params.len() + consts.len()];
    let mut next = 0;
    for (slot, o) in operands.iter_mut().enumerate() {
        if consts.iter().any(|(i, _)| *i == slot) {
            continue;
        }
        *o = Some(b.param(&format!("x{slot}"), params[next].clone()));
        next += 1;
    }
    for (i, ty) in consts {
        let n = ty.storage_len();
        let v = b
            .constant(
                &format!("c{i}"),
                ty.clone(),
                &random_f32(100 + *i as u64, n, -1.0, 1.0),
            )
            .expect("constant");
        operands[*i] = Some(v);
    }
    let operands: Vec<Value> = operands.into_iter().map(|o| o.expect("operand")).collect();
    let y = b.op(op, &operands).expect("op type-checks");
    b.finish(&[("y", y)]);
    m
}

fn check(what: &str, m: &Module) {
    check_against_interp(what, m, &random_inputs(m, 17), 1e-5);
}

fn t(dims: &[usize]) -> TensorType {
    f32t(dims)
}

#[test]
fn unary_ops() {
    let f = F32;
    let ops = [
        UnaryOp::Relu,
        UnaryOp::Clip {
            min: f(-0.3),
            max: f(0.6),
        },
        UnaryOp::LeakyRelu { alpha: f(0.01) },
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Gelu {
            approximate: GeluApproximation::None,
        },
        UnaryOp::Gelu {
            approximate: GeluApproximation::Tanh,
        },
        UnaryOp::Mish,
        UnaryOp::HardSigmoid {
            alpha: f(0.2),
            beta: f(0.5),
        },
        UnaryOp::HardSwish,
        UnaryOp::Silu,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
    ];
    for u in ops {
        for dims in [&[2, 3, 5, 7][..], &[3][..], &[]] {
            let m = one_op(Op::Unary(u), &[t(dims)], &[]);
            check(&format!("{} {dims:?}", u.name()), &m);
        }
    }
}

/// GELU (the erf form, whose epilogue uses its own erf) element by element against the
/// interpreter over [-12, 12] and around 0, on every kernel choice: within 2e-6 of the
/// largest value, and 1e-4 relative to each element from x = −3 up.
#[test]
fn gelu_is_accurate_over_its_range() {
    let mut x: Vec<f32> = (-1200..=1200).map(|i| i as f32 / 100.0).collect();
    x.extend((1..50).flat_map(|i| [i as f32 * 1e-4, -(i as f32) * 1e-4]));
    x.extend([1e30, -1e30]);
    let n = x.len();
    let gelu = UnaryOp::Gelu {
        approximate: GeluApproximation::None,
    };
    let m = one_op(Op::Unary(gelu), &[t(&[n])], &[]);
    let input = smelt_ir::Tensor::new([n], x.clone()).unwrap();
    // (the epilogue is the same Cranelift code on every kernel choice: the last run's
    // outputs stand for all)
    let got = check_against_interp("gelu over its range", &m, &[input], 2e-6);
    let (mut checked, mut worst) = (0, 0.0f64);
    for (&g, &v) in got[0].f32s().iter().zip(&x) {
        let want = 0.5 * v as f64 * (1.0 + libm_erf(v as f64 / std::f64::consts::SQRT_2));
        // relative to each element where 1 + erf(x/√2) is not a cancellation in f32 (x ≥
        // −3: ≥ 0.0013); below, ≈ 1e-7 absolute, which the check above covers
        if v.abs() > 0.1 && v >= -3.0 && v.abs() < 1e29 {
            let rel = ((g as f64 - want) / want).abs();
            worst = worst.max(rel);
            checked += 1;
        }
    }
    eprintln!("gelu: worst relative error {worst:.2e} over {checked} elements");
    assert!(worst < 1e-4, "worst relative error {worst}");
    assert!(checked > 1400, "{checked} elements checked");
}

/// erf in f64 by its Maclaurin series (|x| < 3) or continued fraction tail, accurate to
/// 1e-12 — an oracle independent of the interpreter's.
fn libm_erf(x: f64) -> f64 {
    let a = x.abs();
    let v = if a < 3.0 {
        let (mut term, mut sum, mut k) = (a, a, 0.0);
        while term.abs() > 1e-17 {
            k += 1.0;
            term *= -a * a / k;
            sum += term / (2.0 * k + 1.0);
        }
        2.0 / std::f64::consts::PI.sqrt() * sum
    } else {
        // erfc by Lentz's continued fraction
        let mut f = a;
        for k in (1..60).rev() {
            f = a + (k as f64 / 2.0) / f;
        }
        1.0 - (-a * a).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    v.copysign(x)
}

/// Square root and reciprocal away from their poles: inputs in [0.5, 1.5] (and negative
/// ones for the reciprocal).
#[test]
fn sqrt_and_reciprocal() {
    for u in [UnaryOp::Sqrt, UnaryOp::Reciprocal] {
        let m = one_op(Op::Unary(u), &[t(&[3, 37])], &[]);
        let mut inputs = random_inputs(&m, 3);
        for (i, v) in inputs[0].f32s_mut().iter_mut().enumerate() {
            let sign = if u == UnaryOp::Reciprocal && i % 3 == 0 {
                -1.0
            } else {
                1.0
            };
            *v = sign * (1.0 + *v * 0.5);
        }
        check_against_interp(u.name(), &m, &inputs, 1e-6);
    }
}

/// The logarithm over every binade of f32, subnormals, and its special values.
#[test]
fn log_over_every_binade_and_the_special_values() {
    let mut x: Vec<f32> = (-149..128).map(|e| 2f32.powi(e) * 1.37).collect();
    x.extend([
        0.0,
        -0.0,
        -1.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1.0,
        0.5,
    ]);
    x.extend((0..97).map(|i| 0.75 + i as f32 / 64.0));
    let n = x.len();
    let m = one_op(Op::Unary(UnaryOp::Log), &[t(&[n])], &[]);
    let got = check_against_interp(
        "log",
        &m,
        &[smelt_ir::Tensor::new([n], x.clone()).unwrap()],
        2e-7,
    );
    let y = got[0].f32s();
    for (i, &v) in x.iter().enumerate() {
        let want = v.ln();
        let same = (want.is_nan() && y[i].is_nan())
            || want == y[i]
            || (want - y[i]).abs() <= 2e-7 * want.abs().max(1e-30);
        assert!(same, "log({v:e}) = {} (want {want})", y[i]);
    }
}

/// Floor, ceil and round (halves to even) exactly, on halves, negatives, values beyond
/// 2^23 (already integers), signed zeros and the special values, on every kernel choice.
#[test]
fn floor_ceil_and_round_are_exact_on_halves_and_special_values() {
    let mut x: Vec<f32> = (-40..=40).map(|i| i as f32 * 0.25).collect();
    x.extend([
        0.0,
        -0.0,
        0.49999997,
        -0.49999997,
        2.5,
        3.5,
        -2.5,
        8388607.5,
        16777216.0,
        -1e30,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::MIN_POSITIVE,
    ]);
    let n = x.len();
    let input = smelt_ir::Tensor::new([n], x.clone()).unwrap();
    for (u, f) in [
        (UnaryOp::Floor, f32::floor as fn(f32) -> f32),
        (UnaryOp::Ceil, f32::ceil),
        (UnaryOp::Round, f32::round_ties_even),
    ] {
        let m = one_op(Op::Unary(u), &[t(&[n])], &[]);
        let got = check_against_interp(u.name(), &m, std::slice::from_ref(&input), 0.0);
        for (i, &v) in x.iter().enumerate() {
            let (want, y) = (f(v), got[0].f32s()[i]);
            assert!(
                want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
                "{}({v:e}) = {y:e}, want {want:e}",
                u.name()
            );
        }
    }
}

/// Sign exactly, on both zeros, subnormals, the infinities and NaN.
#[test]
fn sign_is_exact_on_zeros_and_special_values() {
    let x = vec![
        -2.5,
        -0.0,
        0.0,
        1e-40,
        -1e-40,
        3.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
    ];
    let n = x.len();
    let m = one_op(Op::Unary(UnaryOp::Sign), &[t(&[n])], &[]);
    let input = smelt_ir::Tensor::new([n], x.clone()).unwrap();
    let got = check_against_interp("sign", &m, std::slice::from_ref(&input), 0.0);
    for (&v, &y) in x.iter().zip(got[0].f32s()) {
        let want = if v > 0.0 {
            1.0
        } else if v < 0.0 {
            -1.0
        } else {
            v
        };
        assert!(
            want.to_bits() == y.to_bits() || (want.is_nan() && y.is_nan()),
            "sign({v:e}) = {y:e}, want {want:e}"
        );
    }
}

/// Runs `op` on `x` through every kernel choice (each checked against the interpreter to
/// `relative`, FACTS.md's relative error) and returns the JIT's largest error against
/// `reference` in f64, in ulps of the f32 nearest the reference; where the reference is
/// not a finite f32, the result must be the same infinity or NaN.
fn max_ulp_error(op: UnaryOp, x: &[f32], reference: fn(f64) -> f64, relative: f64) -> f64 {
    let n = x.len();
    let m = one_op(Op::Unary(op), &[t(&[n])], &[]);
    let input = smelt_ir::Tensor::new([n], x.to_vec()).unwrap();
    let got = check_against_interp(op.name(), &m, std::slice::from_ref(&input), relative);
    let mut worst = 0.0f64;
    for (&v, &y) in x.iter().zip(got[0].f32s()) {
        let want = reference(v as f64);
        let nearest = want as f32;
        if !nearest.is_finite() {
            assert!(
                y.to_bits() == nearest.to_bits() || (y.is_nan() && nearest.is_nan()),
                "{}({v:e}) = {y:e}, want {want:e}",
                op.name()
            );
            continue;
        }
        let ulp = f32::from_bits(nearest.abs().to_bits() + 1) - nearest.abs();
        worst = worst.max((y as f64 - want).abs() / ulp as f64);
    }
    worst
}

/// `count` points spread evenly over [lo, hi], then every power of two from 2^-30 up to
/// `hi` with both signs (where `lo` < 0), and the special values.
fn sweep(lo: f32, hi: f32, count: usize) -> Vec<f32> {
    let mut x: Vec<f32> = (0..count)
        .map(|i| lo + (hi - lo) * (i as f32 + 0.37) / count as f32)
        .collect();
    for e in -30..=30 {
        let p = 2f32.powi(e);
        if p <= hi {
            x.push(p);
            if lo < 0.0 {
                x.push(-p);
            }
        }
    }
    x.extend([0.0, -0.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN]);
    x
}

/// sin, cos and tan against f64 over |x| ≤ 1e4 and near the multiples of π/2 (where
/// the range reduction must cancel exactly), and ±inf and NaN (NaN results).
#[test]
fn sin_cos_and_tan_are_accurate_over_a_wide_range() {
    let mut x = sweep(-1e4, 1e4, 20_011);
    x.extend((1..2000).flat_map(|k| {
        let m = k as f64 * std::f64::consts::FRAC_PI_2;
        [m as f32, -m as f32, (m * 1.0000001) as f32]
    }));
    for (op, reference, bound) in [
        (UnaryOp::Sin, f64::sin as fn(f64) -> f64, 2.0),
        (UnaryOp::Cos, f64::cos, 2.0),
        (UnaryOp::Tan, f64::tan, 4.0),
    ] {
        let worst = max_ulp_error(op, &x, reference, 2e-7);
        eprintln!("{}: at most {worst:.2} ulp", op.name());
        assert!(worst <= bound, "{}: {worst} ulp", op.name());
    }
}

/// atan over |x| ≤ 1e4 and every binade, asin and acos over [-1, 1] (and NaN outside),
/// against f64.
#[test]
fn atan_asin_and_acos_are_accurate_over_their_domains() {
    let mut unit = sweep(-1.0, 1.0, 20_011);
    unit.extend([1.0, -1.0, 0.999_999_94, -0.999_999_94, 1.000_000_1, -3.0]);
    for (op, x, reference, bound) in [
        (
            UnaryOp::Atan,
            sweep(-1e4, 1e4, 20_011),
            f64::atan as fn(f64) -> f64,
            3.0,
        ),
        (UnaryOp::Asin, unit.clone(), f64::asin, 4.0),
        (UnaryOp::Acos, unit, f64::acos, 4.0),
    ] {
        let worst = max_ulp_error(op, &x, reference, 2e-7);
        eprintln!("{}: at most {worst:.2} ulp", op.name());
        assert!(worst <= bound, "{}: {worst} ulp", op.name());
    }
}

/// sinh and cosh against f64 up to where they overflow f32 (|x| ≈ 89.4), past it
/// (±inf), and over every binade near 0 (where sinh x ≈ x).
#[test]
fn sinh_and_cosh_are_accurate_up_to_overflow() {
    let mut x = sweep(-89.4, 89.4, 20_011);
    x.extend([
        88.0, 88.000_01, 88.72, 89.0, 89.41, 89.5, -89.5, 100.0, -1.0, 1.0,
    ]);
    for (op, reference) in [
        (UnaryOp::Sinh, f64::sinh as fn(f64) -> f64),
        (UnaryOp::Cosh, f64::cosh),
    ] {
        let worst = max_ulp_error(op, &x, reference, 3e-7);
        eprintln!("{}: at most {worst:.2} ulp", op.name());
        assert!(worst <= 4.0, "{}: {worst} ulp", op.name());
    }
}

/// asinh over |x| ≤ 1e6, acosh over [1, 1e6] (NaN below 1), atanh over (-1, 1) (±inf at
/// ±1, NaN beyond), each with every binade near its root, against f64.
#[test]
fn inverse_hyperbolic_functions_are_accurate_over_their_domains() {
    let mut above_one = sweep(1.0, 1e6, 20_011);
    above_one.extend((1..40).map(|i| 1.0 + i as f32 * f32::EPSILON));
    above_one.extend([0.5, -2.0, f32::MAX]);
    let mut unit = sweep(-1.0, 1.0, 20_011);
    unit.extend([1.0, -1.0, 0.999_999_94, -0.999_999_94, 1.5, -3.0]);
    let mut wide = sweep(-1e6, 1e6, 20_011);
    wide.extend([4095.0, 4097.0, f32::MAX, -f32::MAX]);
    for (op, x, reference) in [
        (UnaryOp::Asinh, wide, f64::asinh as fn(f64) -> f64),
        (UnaryOp::Acosh, above_one, f64::acosh),
        (UnaryOp::Atanh, unit, f64::atanh),
    ] {
        let worst = max_ulp_error(op, &x, reference, 3e-7);
        eprintln!("{}: at most {worst:.2} ulp", op.name());
        assert!(worst <= 4.0, "{}: {worst} ulp", op.name());
    }
}

#[test]
fn unary_ops_on_wide_inputs() {
    // values in [-1, 1] hide range problems: scale them up to [-12, 12]
    for u in [
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Erf,
        UnaryOp::Gelu {
            approximate: GeluApproximation::None,
        },
        UnaryOp::Gelu {
            approximate: GeluApproximation::Tanh,
        },
        UnaryOp::Mish,
        UnaryOp::Silu,
        UnaryOp::Exp,
    ] {
        let m = one_op(Op::Unary(u), &[t(&[203])], &[]);
        let mut inputs = random_inputs(&m, 5);
        for v in inputs[0].f32s_mut() {
            *v *= 12.0;
        }
        check_against_interp(u.name(), &m, &inputs, 1e-5);
    }
}

#[test]
fn binary_ops_with_broadcasting() {
    let shapes: [(&[usize], &[usize]); 6] = [
        (&[2, 3, 5, 7], &[2, 3, 5, 7]),
        (&[2, 3, 5, 7], &[3, 1, 1]),
        (&[1, 7], &[2, 3, 5, 7]),
        (&[2, 3, 5, 7], &[]),
        (&[3, 1, 5], &[1, 4, 1]),
        (&[9], &[9]),
    ];
    for op in [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Min,
        BinaryOp::Max,
        BinaryOp::PRelu,
    ] {
        for (a, b) in shapes {
            let m = one_op(Op::Binary(op), &[t(a), t(b)], &[]);
            let mut inputs = random_inputs(&m, 3);
            if op == BinaryOp::Div {
                for v in inputs[1].f32s_mut() {
                    *v += 1.5;
                }
            }
            check_against_interp(&format!("{} {a:?} {b:?}", op.name()), &m, &inputs, 1e-5);
        }
    }
}

#[test]
fn batch_norm() {
    let c = 5;
    let m = one_op(
        Op::BatchNorm { epsilon: F32(1e-3) },
        &[t(&[2, c, 3, 7]), t(&[c]), t(&[c]), t(&[c])],
        &[(4, t(&[c]))],
    );
    let inputs = random_inputs(&m, 4);
    // the variance (the constant operand, made from [-1, 1]) must be positive: rebuild the
    // weights with |var| + 0.1
    let mut m2 = m.clone();
    let wid = m2.weights.lookup("c4").expect("var weight");
    let w = m2.weights.get(wid).expect("weight").clone();
    let positive: Vec<f32> = w.f32s().iter().map(|v| v.abs() + 0.1).collect();
    let mut store = smelt_ir::WeightStore::new();
    for (id, wt) in m2.weights.iter() {
        let data = if id == wid {
            smelt_ir::AlignedBuf::from_f32(&positive)
        } else {
            (*wt.data).clone()
        };
        store
            .add(wt.name.clone(), wt.ty.clone(), data, wt.origin.clone())
            .expect("re-add");
    }
    m2.weights = store;
    check_against_interp("batch_norm", &m2, &inputs, 1e-5);
}

fn pool(kernel: usize, stride: usize, pads: [usize; 4], dil: usize, ceil: bool) -> Pool2dAttrs {
    Pool2dAttrs {
        kernel: [kernel, kernel],
        strides: [stride, stride],
        pads,
        dilations: [dil, dil],
        ceil_mode: ceil,
        layout: smelt_ir::Layout::RowMajor,
    }
}

#[test]
fn pools() {
    let small = t(&[2, 3, 9, 11]);
    // windows of more than 64 taps walk their rows in a loop instead of unrolling; max
    // pools take each plane's row maxima first where they fit 16 KiB (every case but the
    // wide plane's)
    let large = t(&[1, 2, 31, 27]);
    let wide = t(&[1, 1, 80, 80]);
    let cases = [
        (&wide, pool(9, 1, [4; 4], 1, false)),
        (&wide, pool(5, 1, [2; 4], 1, false)),
        (&small, pool(3, 2, [1; 4], 1, false)),
        (&small, pool(2, 2, [0; 4], 1, true)),
        (&small, pool(3, 1, [0, 1, 2, 0], 2, false)),
        (&small, pool(3, 2, [1, 1, 0, 0], 1, true)),
        (&small, pool(1, 1, [0; 4], 1, false)),
        (&large, pool(9, 2, [2, 3, 4, 1], 1, true)),
        (&large, pool(9, 3, [1; 4], 2, false)),
    ];
    for (x, p) in &cases {
        let m = one_op(Op::MaxPool2d(p.clone()), std::slice::from_ref(*x), &[]);
        check(&format!("max_pool {p:?}"), &m);
        for include in [true, false] {
            let op = Op::AvgPool2d {
                pool: p.clone(),
                count_include_pad: include,
            };
            let m = one_op(op, std::slice::from_ref(*x), &[]);
            check(&format!("avg_pool include_pad={include} {p:?}"), &m);
        }
    }
    // the 3x3 stride-2 max pool that halves an even H and a W that is a multiple of 8
    // has its own kernel (no padded copy); with bottom/right padding or not, ceil or not
    for dims in [&[2, 3, 10, 16][..], &[1, 5, 2, 8], &[1, 2, 12, 24]] {
        let x = t(dims);
        for p in [
            pool(3, 2, [1; 4], 1, false),
            pool(3, 2, [1, 1, 0, 0], 1, true),
        ] {
            let m = one_op(Op::MaxPool2d(p.clone()), std::slice::from_ref(&x), &[]);
            check(&format!("max_pool {dims:?} {p:?}"), &m);
        }
    }
    for dims in [&[2, 5, 3, 7][..], &[1, 3, 1, 1], &[1, 4, 9, 9]] {
        let m = one_op(Op::GlobalAvgPool, &[t(dims)], &[]);
        check(&format!("global_avg_pool {dims:?}"), &m);
    }
}

#[test]
fn conv_transpose2d_over_shapes_strides_pads_groups_dilations_and_output_padding() {
    // (input dims, out channels per group, kernel, strides, pads, dilations, groups,
    // output padding, weights constant); widths odd and even so vector tails run
    type Case = (
        [usize; 4],
        usize,
        [usize; 2],
        [usize; 2],
        [usize; 4],
        [usize; 2],
        usize,
        [usize; 2],
        bool,
    );
    #[rustfmt::skip]
    let cases: &[Case] = &[
        ([1, 4, 5, 7],  3, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], true),  // DBNet head
        ([2, 3, 6, 9],  2, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 1, [0, 0], false), // vectors
        ([1, 4, 4, 5],  3, [3, 3], [2, 3], [1, 0, 2, 1], [1, 1], 2, [1, 2], true),
        ([1, 6, 5, 4],  1, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 6, [1, 1], true),  // depthwise
        ([1, 2, 5, 11], 2, [3, 2], [1, 1], [2, 0, 1, 1], [2, 3], 1, [0, 0], false), // dilated
        ([1, 3, 3, 3],  4, [4, 4], [3, 3], [1, 2, 3, 0], [1, 1], 1, [2, 0], true),
        ([1, 8, 3, 8],  2, [1, 1], [1, 1], [0, 0, 0, 0], [1, 1], 4, [0, 0], false), // 1x1
        ([1, 2, 1, 13], 3, [1, 5], [1, 2], [0, 2, 0, 1], [1, 2], 1, [0, 1], true),  // 1-D
        ([1, 4, 2, 2],  2, [5, 5], [1, 1], [2, 2, 2, 2], [1, 1], 2, [0, 0], false), // crop to 2x2
        ([1, 3, 4, 6], 18, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], true),  // 16 + 2 channels
        ([2, 4, 3, 5], 16, [3, 3], [1, 1], [1, 1, 1, 1], [1, 1], 2, [0, 1], false), // 16 per group
        ([1, 8, 5, 6], 20, [3, 3], [2, 2], [1, 1, 1, 1], [1, 1], 1, [1, 1], true),  // 5 vectors
        ([1, 8, 4, 5], 16, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], false), // tile of 16
        // kernel = stride, constant weights: one product on micro-kernel tiles (where the
        // host runs them), its 2×2 taps shuffled into rows, other kernels stored singly
        ([2, 5, 3, 37], 8, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], true),  // 3 tiles, odd tail
        ([1, 24, 6, 9], 1, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], true),  // 1-channel head
        ([1, 6, 4, 5],  9, [2, 2], [2, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], true),  // 36 columns
        ([1, 4, 3, 7],  5, [3, 3], [3, 3], [0, 0, 0, 0], [1, 1], 1, [0, 0], true),  // 9 taps: gathered
        ([1, 3, 5, 6],  4, [1, 2], [1, 2], [0, 0, 0, 0], [1, 1], 1, [0, 0], true),  // 1x2 singly
    ];
    for &(xd, og, k, strides, pads, dilations, groups, output_padding, const_w) in cases {
        let attrs = ConvTranspose2dAttrs {
            strides,
            pads,
            dilations,
            groups,
            output_padding,
        };
        let w = t(&[xd[1], og, k[0], k[1]]);
        let bias = t(&[og * groups]);
        for with_bias in [false, true] {
            let op = Op::ConvTranspose2d(attrs.clone());
            let m = if const_w {
                let consts: Vec<(usize, TensorType)> = if with_bias {
                    vec![(1, w.clone()), (2, bias.clone())]
                } else {
                    vec![(1, w.clone())]
                };
                one_op(op, &[t(&xd)], &consts)
            } else if with_bias {
                one_op(op, &[t(&xd), w.clone(), bias.clone()], &[])
            } else {
                one_op(op, &[t(&xd), w.clone()], &[])
            };
            check(
                &format!("conv_transpose2d {xd:?} {attrs:?} bias {with_bias}"),
                &m,
            );
        }
        // as a fusion anchor: a per-channel scale (a BN turned affine), a per-channel
        // PRelu, Mish, and a scalar on the left of a sub, applied as each element is stored
        let chan = t(&[og * groups, 1, 1]);
        let post = vec![
            PostOp::Binary {
                op: BinaryOp::Mul,
                acc_is_lhs: true,
            },
            PostOp::Binary {
                op: BinaryOp::PRelu,
                acc_is_lhs: true,
            },
            PostOp::Unary(UnaryOp::Mish),
            PostOp::Binary {
                op: BinaryOp::Sub,
                acc_is_lhs: false,
            },
        ];
        let op = fused(Op::ConvTranspose2d(attrs.clone()), post);
        let m = if const_w {
            let consts = [(1, w.clone()), (2, bias.clone())];
            one_op(op, &[t(&xd), chan.clone(), chan, t(&[])], &consts)
        } else {
            one_op(
                op,
                &[t(&xd), w.clone(), bias.clone(), chan.clone(), chan, t(&[])],
                &[],
            )
        };
        check(&format!("fused conv_transpose2d {xd:?} {attrs:?}"), &m);
    }
}

/// A transposed convolution whose kernel equals its stride, on a micro-kernel target,
/// lowers to one product kernel (no weight repacking kernel, no gather by phase) whatever
/// the ISA; on Cranelift code, or with a 3×3 kernel (9 taps: no routine's lanes hold
/// whole channels), it keeps the gather.
#[test]
fn kernel_sized_stride_conv_transpose_lowers_to_one_product() {
    let names = |k: usize, micro: Option<smelt_ir::loops::TileTarget>| {
        let attrs = ConvTranspose2dAttrs {
            strides: [k, k],
            ..ConvTranspose2dAttrs::default()
        };
        let consts = [(1, t(&[24, 24, k, k])), (2, t(&[24]))];
        let m = one_op(Op::ConvTranspose2d(attrs), &[t(&[1, 24, 8, 10])], &consts);
        let opts = smelt_passes::lower::LowerOptions {
            micro,
            ..Default::default()
        };
        let p = smelt_passes::lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
        p.kernels.iter().map(|k| k.name.clone()).collect::<Vec<_>>()
    };
    for isa in [
        smelt::microkernels::TileIsa::Avx2,
        smelt::microkernels::TileIsa::Avx512,
    ] {
        let got = names(2, Some(isa.target()));
        assert!(
            got.len() == 1 && got[0].starts_with("conv_transpose2d_product"),
            "{isa:?}: {got:?}"
        );
        let gathered = names(3, Some(isa.target()));
        assert!(
            gathered.iter().all(|k| !k.contains("product")),
            "{gathered:?}"
        );
    }
    let plain = names(2, None);
    assert!(plain.iter().all(|k| !k.contains("product")), "{plain:?}");
}

#[test]
fn matmul_shapes() {
    let cases: [(&[usize], &[usize]); 7] = [
        (&[5, 7], &[7, 9]),
        (&[13, 19], &[19, 14]),
        (&[2, 3, 5, 7], &[7, 6]),
        (&[2, 1, 5, 7], &[3, 7, 4]),
        (&[7], &[7, 9]),
        (&[5, 7], &[7]),
        (&[1, 1], &[1, 1]),
    ];
    for (a, b) in cases {
        let m = one_op(Op::MatMul, &[t(a), t(b)], &[]);
        check(&format!("matmul {a:?} x {b:?}"), &m);
    }
}

#[test]
fn gemm_variants() {
    let (mm, k, n) = (5, 7, 9);
    for trans_a in [false, true] {
        for trans_b in [false, true] {
            for c_dims in [None, Some(vec![n]), Some(vec![mm, n]), Some(vec![mm, 1])] {
                let g = GemmAttrs {
                    alpha: F32(0.75),
                    beta: F32(-1.25),
                    trans_a,
                    trans_b,
                };
                let a = if trans_a { t(&[k, mm]) } else { t(&[mm, k]) };
                let b = if trans_b { t(&[n, k]) } else { t(&[k, n]) };
                let mut params = vec![a, b.clone()];
                if let Some(c) = &c_dims {
                    params.push(t(c));
                }
                let what = format!("gemm tA={trans_a} tB={trans_b} C={c_dims:?}");
                let m = one_op(Op::Gemm(g.clone()), &params, &[]);
                check(&what, &m);
                // B as a constant (the usual fully connected layer): packed at compile time
                let mut params = vec![params[0].clone()];
                if let Some(c) = &c_dims {
                    params.push(t(c));
                }
                let m = one_op(Op::Gemm(g), &params, &[(1, b)]);
                check(&format!("{what} const B"), &m);
            }
        }
    }
}

/// One row of A against a `transB` matrix (a classifier layer): the dot-product kernel,
/// with k a multiple of 16 and not, n taken 1, 4 or 8 rows at a time, every C
/// broadcast, B as a parameter and a constant.
#[test]
fn gemv_variants() {
    // n = 9, 12, 16: rows one, four and eight at a time
    for (n, k) in [(9, 16), (9, 37), (12, 37), (16, 16)] {
        for trans_a in [false, true] {
            for c_dims in [None, Some(vec![n]), Some(vec![1, n]), Some(vec![1, 1])] {
                let g = GemmAttrs {
                    alpha: F32(0.75),
                    beta: F32(-1.25),
                    trans_a,
                    trans_b: true,
                };
                let a = if trans_a { t(&[k, 1]) } else { t(&[1, k]) };
                let b = t(&[n, k]);
                let mut params = vec![a, b.clone()];
                if let Some(c) = &c_dims {
                    params.push(t(c));
                }
                let what = format!("gemv k={k} tA={trans_a} C={c_dims:?}");
                check(&what, &one_op(Op::Gemm(g.clone()), &params, &[]));
                params.remove(1);
                let m = one_op(Op::Gemm(g), &params, &[(1, b)]);
                check(&format!("{what} const B"), &m);
            }
        }
    }
}

#[test]
fn normalizations() {
    for (dims, axis) in [
        (&[2, 3, 7][..], 2),
        (&[2, 3, 7], 1),
        (&[4, 13], 1),
        (&[5], 0),
    ] {
        let m = one_op(Op::Softmax { axis }, &[t(dims)], &[]);
        check(&format!("softmax {dims:?} axis {axis}"), &m);
    }
    // rows along the last axis on a micro-kernel target call the native softmax-row
    // routine: lengths around its vector widths (8, 16), attention rows of 128 and 197
    for (dims, axis) in [
        (&[3, 33][..], 1),
        (&[2, 2, 128], 2),
        (&[1, 3, 4, 197], 3),
        (&[4, 16], 1),
    ] {
        let m = one_op(Op::Softmax { axis }, &[t(dims)], &[]);
        check(&format!("softmax rows {dims:?}"), &m);
        for (micro, native) in [
            (Some(smelt::microkernels::TileIsa::Avx2.target()), true),
            (None, false),
        ] {
            let opts = smelt_passes::lower::LowerOptions {
                micro,
                ..Default::default()
            };
            let p = smelt_passes::lower::lower_with(&m, &m.funcs[0], &opts).expect("lowers");
            assert_eq!(
                p.dump_loops().contains("call softmax_row"),
                native,
                "{dims:?} with {micro:?}"
            );
        }
    }
    let m = one_op(Op::Softmax { axis: 1 }, &[t(&[2, 9, 5])], &[]);
    let mut inputs = random_inputs(&m, 2);
    for v in inputs[0].f32s_mut() {
        *v *= 30.0;
    }
    check_against_interp("softmax large logits", &m, &inputs, 1e-5);
    for (dims, axis) in [(&[2, 3, 7][..], 2), (&[2, 3, 9], 1), (&[3, 5], 0)] {
        let norm: Vec<usize> = dims[axis..].to_vec();
        let op = Op::LayerNorm {
            axis,
            epsilon: F32(1e-5),
        };
        let m = one_op(op.clone(), &[t(dims), t(&norm), t(&norm)], &[]);
        check(&format!("layer_norm {dims:?} axis {axis}"), &m);
        let m = one_op(op, &[t(dims), t(&norm)], &[]);
        check(&format!("layer_norm {dims:?} axis {axis} no bias"), &m);
    }
}

#[test]
fn data_movement() {
    let x = t(&[2, 3, 5, 7]);
    let m = one_op(Op::Flatten { axis: 2 }, std::slice::from_ref(&x), &[]);
    check("flatten", &m);
    let m = one_op(
        Op::Reshape { shape: vec![6, 35] },
        std::slice::from_ref(&x),
        &[],
    );
    check("reshape", &m);
    for perm in [
        vec![0, 2, 3, 1],
        vec![3, 2, 1, 0],
        vec![0, 1, 3, 2],
        vec![1, 0, 2, 3],
    ] {
        let m = one_op(
            Op::Transpose { perm: perm.clone() },
            std::slice::from_ref(&x),
            &[],
        );
        check(&format!("transpose {perm:?}"), &m);
    }
    // transposes that move a source-contiguous axis inwards copy 4×4 blocks through
    // registers: whole blocks, and tails on either axis (YOLO's head is [3, 85, 52²])
    for (dims, perm) in [
        (vec![1, 3, 9, 6, 6], vec![0, 1, 3, 4, 2]),
        (vec![2, 8, 12], vec![0, 2, 1]),
        (vec![5, 4, 3, 6], vec![2, 3, 1, 0]),
    ] {
        let m = one_op(Op::Transpose { perm: perm.clone() }, &[t(&dims)], &[]);
        check(&format!("transpose {dims:?} by {perm:?}"), &m);
    }
    for axis in 0..4 {
        let mut other = x.dims.clone();
        other[axis] = 2;
        let m = one_op(Op::Concat { axis }, &[x.clone(), t(&other), x.clone()], &[]);
        check(&format!("concat axis {axis}"), &m);
    }
}

#[test]
fn reorder_round_trip_and_padding_lanes() {
    for (dims, block) in [
        (&[1, 6, 3, 5][..], 4u8),
        (&[2, 8, 2, 3], 8),
        (&[1, 3, 2, 2], 4),
    ] {
        let blocked = Layout::Blocked { axis: 1, block };
        let m = one_op(Op::Reorder { layout: blocked }, &[t(dims)], &[]);
        let got = check_against_interp(
            &format!("to blocked {dims:?}"),
            &m,
            &random_inputs(&m, 1),
            0.0,
        );
        // padding lanes are zero, exactly as the interpreter writes them
        let want = smelt_ir::interp::run(&m, &m.funcs[0], &random_inputs(&m, 1)).expect("interp");
        assert_eq!(got[0].data, want[0].data, "storage including padding lanes");
        let back = one_op(
            Op::Reorder {
                layout: Layout::RowMajor,
            },
            &[t(dims).with_layout(blocked)],
            &[],
        );
        check_against_interp(
            &format!("from blocked {dims:?}"),
            &back,
            &random_inputs(&back, 2),
            0.0,
        );
    }
}

fn fused(anchor: Op, post_ops: Vec<PostOp>) -> Op {
    Op::Fused(FusedOp {
        anchor: Box::new(anchor),
        post_ops,
    })
}

#[test]
fn fused_ops_on_every_anchor_kind() {
    let add = PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: true,
    };
    let relu = PostOp::Unary(UnaryOp::Relu);
    // gemm + per-column bias + relu (a fully connected layer)
    let m = one_op(
        fused(Op::Gemm(GemmAttrs::default()), vec![add, relu]),
        &[t(&[5, 7]), t(&[9])],
        &[(1, t(&[7, 9]))],
    );
    check("fused gemm", &m);
    // matmul + full residual
    let m = one_op(
        fused(Op::MatMul, vec![add]),
        &[t(&[2, 5, 7]), t(&[7, 6]), t(&[2, 5, 6])],
        &[],
    );
    check("fused matmul", &m);
    // max pool + relu, avg pool + residual
    let p = pool(3, 2, [1; 4], 1, false);
    let m = one_op(
        fused(Op::MaxPool2d(p.clone()), vec![relu]),
        &[t(&[1, 3, 9, 9])],
        &[],
    );
    check("fused max pool", &m);
    let avg = Op::AvgPool2d {
        pool: p,
        count_include_pad: false,
    };
    let m = one_op(
        fused(avg, vec![add]),
        &[t(&[1, 3, 9, 9]), t(&[1, 3, 5, 5])],
        &[],
    );
    check("fused avg pool", &m);
    // global average pool + sigmoid (squeeze-excite)
    let m = one_op(
        fused(Op::GlobalAvgPool, vec![PostOp::Unary(UnaryOp::Sigmoid)]),
        &[t(&[2, 5, 3, 3])],
        &[],
    );
    check("fused global avg pool", &m);
    // layer norm + gelu + residual: post-ops in a second pass
    let ln = Op::LayerNorm {
        axis: 2,
        epsilon: F32(1e-5),
    };
    let m = one_op(
        fused(
            ln,
            vec![
                PostOp::Unary(UnaryOp::Gelu {
                    approximate: GeluApproximation::Tanh,
                }),
                add,
            ],
        ),
        &[t(&[2, 3, 7]), t(&[7]), t(&[7]), t(&[2, 3, 7])],
        &[],
    );
    check("fused layer norm", &m);
}

/// Every unary elementwise op (the op table's samples, so a new one is covered without an
/// edit) as the post-op of a GEMM with a bias, in the tile epilogue the fusion pass
/// absorbs it into.
#[test]
fn every_unary_op_is_a_gemm_post_op() {
    let add = PostOp::Binary {
        op: BinaryOp::Add,
        acc_is_lhs: true,
    };
    let unary = smelt_ir::op::samples().iter().filter_map(|op| {
        if let Op::Unary(u) = op {
            Some(*u)
        } else {
            None
        }
    });
    for u in unary {
        let m = one_op(
            fused(Op::Gemm(GemmAttrs::default()), vec![add, PostOp::Unary(u)]),
            &[t(&[5, 7]), t(&[9])],
            &[(1, t(&[7, 9]))],
        );
        check(&format!("gemm + {}", u.name()), &m);
    }
}

/// A NaN anywhere in a max-pool window makes that output NaN, as in the interpreter,
/// whichever tap of the window it is in.
#[test]
fn max_pool_propagates_nan() {
    // 7x8 takes the general kernel, 8x16 the 3x3 stride-2 one (NaNs in its first and
    // last rows and columns, and on both sides of a vector boundary)
    for (dims, nans) in [
        ([1, 2, 7, 8], &[0, 9, 17, 30, 63, 64, 100][..]),
        (
            [1, 2, 8, 16],
            &[0, 15, 16, 39, 40, 112, 127, 135, 200, 255][..],
        ),
    ] {
        max_pool_nan_case(&dims, nans, pool(3, 2, [1; 4], 1, false));
    }
    // SPP's 5×5 stride-1 pools, through the row maxima
    max_pool_nan_case(
        &[1, 2, 13, 13],
        &[0, 12, 84, 168, 200, 337],
        pool(5, 1, [2; 4], 1, false),
    );
}

fn max_pool_nan_case(dims: &[usize], nans: &[usize], attrs: Pool2dAttrs) {
    let x = t(dims);
    let m = one_op(Op::MaxPool2d(attrs), std::slice::from_ref(&x), &[]);
    let mut inputs = random_inputs(&m, 23);
    for &i in nans {
        inputs[0].f32s_mut()[i] = f32::NAN;
    }
    let want = smelt_ir::interp::run(&m, &m.funcs[0], &inputs).expect("interprets");
    let exe = smelt::runtime::Executable::compile(&m, None, &jit_util::opts()).expect("compiles");
    let got = exe.run(&inputs).expect("runs");
    let (g, w) = (got[0].f32s(), want[0].f32s());
    assert!(w.iter().any(|v| v.is_nan()), "the case has NaN outputs");
    for (i, (a, b)) in g.iter().zip(w).enumerate() {
        assert_eq!(
            a.is_nan(),
            b.is_nan(),
            "output {i}: jit {a}, interpreter {b}"
        );
        if !b.is_nan() {
            assert_eq!(a, b, "output {i}");
        }
    }
}

/// Input dims, then starts, ends and steps per axis.
type SliceCase = (
    &'static [usize],
    &'static [i64],
    &'static [i64],
    &'static [i64],
);

#[test]
fn slice_positive_negative_and_unit_steps() {
    let cases: [SliceCase; 7] = [
        (&[2, 3, 5, 7], &[0, 0, 0, 0], &[2, 3, 5, 7], &[1, 1, 1, 1]),
        (&[2, 3, 5, 7], &[1, 0, 1, 2], &[2, 3, 4, 7], &[1, 1, 1, 1]),
        (&[2, 3, 5, 7], &[0, 0, 0, 1], &[2, 3, 5, 7], &[1, 2, 2, 3]),
        (
            &[2, 3, 5, 7],
            &[1, 2, 4, 6],
            &[-1, -1, -1, -1],
            &[-1, -1, -1, -1],
        ),
        (
            &[2, 3, 5, 7],
            &[0, 2, 4, 5],
            &[2, 0, -1, 0],
            &[1, -2, -3, -2],
        ),
        (&[9, 11], &[8, 1], &[0, 10], &[-1, 1]),
        (&[13], &[12], &[-1], &[-5]),
    ];
    for (dims, starts, ends, steps) in cases {
        let op = Op::Slice(SliceAttrs {
            starts: starts.to_vec(),
            ends: ends.to_vec(),
            steps: steps.to_vec(),
        });
        let m = one_op(op, &[t(dims)], &[]);
        check(&format!("slice {dims:?} {starts:?} {ends:?} {steps:?}"), &m);
    }
}

#[test]
fn expand_and_tile_over_shapes() {
    let expands: [(&[usize], &[usize]); 5] = [
        (&[3, 1], &[2, 3, 5]),
        (&[1, 5, 1], &[4, 5, 7]),
        (&[7], &[3, 2, 7]),
        (&[], &[3, 5]),
        (&[2, 3], &[2, 3]),
    ];
    for (from, to) in expands {
        let m = one_op(Op::Expand { shape: to.to_vec() }, &[t(from)], &[]);
        check(&format!("expand {from:?} to {to:?}"), &m);
    }
    let tiles: [(&[usize], &[usize]); 4] = [
        (&[2, 3, 5], &[1, 2, 3]),
        (&[3, 7], &[3, 1]),
        (&[5], &[4]),
        (&[1, 3, 1, 2], &[2, 1, 5, 3]),
    ];
    for (from, repeats) in tiles {
        let op = Op::Tile {
            repeats: repeats.to_vec(),
        };
        let m = one_op(op, &[t(from)], &[]);
        check(&format!("tile {from:?} by {repeats:?}"), &m);
    }
}

#[test]
fn reductions_over_every_axis_set() {
    use smelt_ir::op::{ReduceAttrs, Reduction};
    let shapes: [&[usize]; 3] = [&[2, 3, 37], &[4, 16], &[3, 5, 2, 7]];
    for dims in shapes {
        let rank = dims.len();
        // every non-empty axis subset: trailing runs take the vector path, others not
        for mask in 1u32..(1 << rank) {
            let axes: Vec<usize> = (0..rank).filter(|k| mask & (1 << k) != 0).collect();
            for r in [
                Reduction::Sum,
                Reduction::Mean,
                Reduction::Max,
                Reduction::Min,
            ] {
                for keep_dims in [false, true] {
                    let attrs = ReduceAttrs {
                        axes: axes.clone(),
                        keep_dims,
                    };
                    let m = one_op(Op::Reduce(r, attrs), &[t(dims)], &[]);
                    check(
                        &format!("{r:?} {dims:?} axes {axes:?} keep {keep_dims}"),
                        &m,
                    );
                }
            }
        }
    }
}

#[test]
fn reductions_propagate_nan_like_the_interpreter() {
    use smelt_ir::op::{ReduceAttrs, Reduction};
    for r in [Reduction::Sum, Reduction::Max, Reduction::Min] {
        let m = one_op(
            Op::Reduce(
                r,
                ReduceAttrs {
                    axes: vec![1],
                    keep_dims: false,
                },
            ),
            &[t(&[2, 12])],
            &[],
        );
        let mut x: Vec<f32> = (0..24).map(|v| v as f32 - 11.0).collect();
        x[5] = f32::NAN;
        x[12 + 11] = f32::NAN; // one NaN in a vector lane of each row
        let got = check_against_interp(
            &format!("{r:?} with NaN"),
            &m,
            &[smelt_ir::Tensor::new([2, 12], x).unwrap()],
            0.0,
        );
        assert!(
            got[0].f32s().iter().all(|v| v.is_nan()),
            "{r:?}: {:?}",
            got[0].f32s()
        );
    }
}

#[test]
fn resize_nearest_and_linear_in_every_coordinate_mode() {
    use smelt_ir::op::{CoordinateMode, NearestMode, ResizeAttrs, ResizeMode};
    let cases: [(&[usize], &[usize], &[f32]); 4] = [
        (&[1, 2, 4, 5], &[1, 2, 8, 10], &[1.0, 1.0, 2.0, 2.0]),
        (&[1, 3, 9, 7], &[1, 3, 4, 3], &[1.0, 1.0, 0.5, 0.5]),
        (&[2, 6, 5], &[2, 15, 5], &[1.0, 2.5, 1.0]),
        (&[3, 4], &[7, 9], &[7.0 / 3.0, 9.0 / 4.0]),
    ];
    let modes = [
        ResizeMode::Linear,
        ResizeMode::Cubic(ResizeMode::DEFAULT_CUBIC_A),
        ResizeMode::Nearest(NearestMode::RoundPreferFloor),
        ResizeMode::Nearest(NearestMode::RoundPreferCeil),
        ResizeMode::Nearest(NearestMode::Floor),
        ResizeMode::Nearest(NearestMode::Ceil),
    ];
    for (input, sizes, scales) in cases {
        for &(coordinate, _) in &CoordinateMode::NAMES {
            for mode in modes {
                let roi = if coordinate == CoordinateMode::TfCropAndResize {
                    // a window reaching past the input on both ends of every axis
                    let rank = input.len();
                    let mut roi = vec![F32(-0.1); rank];
                    roi.extend(std::iter::repeat_n(F32(1.2), rank));
                    roi
                } else {
                    Vec::new()
                };
                let attrs = ResizeAttrs {
                    sizes: sizes.to_vec(),
                    scales: scales.iter().map(|&s| F32(s)).collect(),
                    mode,
                    coordinate,
                    roi,
                    extrapolation: F32(7.5),
                    ..ResizeAttrs::default()
                };
                let m = one_op(Op::Resize(attrs), &[t(input)], &[]);
                check(
                    &format!("{mode:?} {coordinate:?} {input:?} -> {sizes:?}"),
                    &m,
                );
            }
        }
    }
}

/// Antialiased shrinking (kernels of 4 to 40 taps an axis: written out, then looped) and
/// `exclude_outside`, against the interpreter.
#[test]
fn resize_antialias_and_exclude_outside() {
    use smelt_ir::op::{ResizeAttrs, ResizeMode};
    let cases: [(&[usize], &[usize], &[f32]); 3] = [
        (&[1, 1, 8, 8], &[1, 1, 6, 6], &[1.0, 1.0, 0.75, 0.75]),
        (&[1, 2, 20, 9], &[1, 2, 2, 3], &[1.0, 1.0, 0.1, 1.0 / 3.0]),
        (&[5, 7], &[10, 3], &[2.0, 3.0 / 7.0]),
    ];
    for (input, sizes, scales) in cases {
        for mode in [ResizeMode::Linear, ResizeMode::Cubic(F32(-0.5))] {
            for (antialias, exclude_outside) in [(true, false), (false, true), (true, true)] {
                let attrs = ResizeAttrs {
                    sizes: sizes.to_vec(),
                    scales: scales.iter().map(|&s| F32(s)).collect(),
                    mode,
                    antialias,
                    exclude_outside,
                    ..ResizeAttrs::default()
                };
                let m = one_op(Op::Resize(attrs), &[t(input)], &[]);
                check(
                    &format!("{mode:?} antialias {antialias} exclude {exclude_outside} {input:?} -> {sizes:?}"),
                    &m,
                );
            }
        }
    }
}

/// `grid_sample` over every mode, padding and `align_corners`, on images and volumes,
/// with grids reaching well outside [-1, 1] and holding NaN and infinities, against the
/// interpreter: the kernel's coordinate arithmetic (clamps, reflection, masks) must agree
/// with the oracle's and never read outside the input.
#[test]
fn grid_sample_every_mode_padding_and_alignment() {
    use smelt_ir::op::{GridPadding, GridSampleAttrs, SampleMode};
    use smelt_ir::Tensor;
    // (input, grid): 2-D with a non-square grid, 3-D with a volume grid
    let cases: [(&[usize], &[usize]); 3] = [
        (&[2, 3, 5, 7], &[2, 4, 6, 2]),
        (&[1, 2, 1, 4], &[1, 3, 5, 2]),
        (&[1, 2, 3, 4, 5], &[1, 2, 3, 4, 3]),
    ];
    for (input, grid) in cases {
        let n: usize = grid.iter().product();
        // coordinates in [-2.5, 2.5]: inside, just outside and beyond a reflection
        let mut g: Vec<f32> = random_f32(7, n, -2.5, 2.5);
        g[1] = f32::NAN;
        g[4] = f32::INFINITY;
        g[9] = f32::NEG_INFINITY;
        g[n - 1] = f32::NAN;
        g[n / 2] = 1e30;
        let x_len: usize = input.iter().product();
        let inputs = [
            Tensor::new(input.to_vec(), random_f32(3, x_len, -1.0, 1.0)).expect("x"),
            Tensor::new(grid.to_vec(), g).expect("grid"),
        ];
        for mode in [SampleMode::Linear, SampleMode::Nearest, SampleMode::Cubic] {
            for (padding, _) in GridPadding::NAMES {
                for align_corners in [false, true] {
                    let attrs = GridSampleAttrs {
                        mode,
                        padding,
                        align_corners,
                    };
                    let m = one_op(Op::GridSample(attrs), &[t(input), t(grid)], &[]);
                    let what = format!("{mode:?} {padding:?} align {align_corners} {input:?}");
                    let got = check_against_interp(&what, &m, &inputs, 1e-5);
                    // padding makes every sample finite, whatever the grid holds
                    assert!(
                        got[0].f32s().iter().all(|v| v.is_finite()),
                        "{what}: {:?}",
                        got[0].f32s()
                    );
                }
            }
        }
    }
}

/// A nearest resize whose taps repeat each element an integer number of times along
/// every axis (ONNX's `floor`/`asymmetric` upsampling of FPNs and YOLO necks) is one
/// kernel of affine loops, each element loaded once and stored to its copies (written out
/// up to 8, looped past); the same factors in another rounding mode, a non-integer
/// factor and a shrink keep the table kernel. Every case against the interpreter, exactly.
#[test]
fn nearest_integer_upsampling_repeats_elements() {
    use smelt_ir::op::{CoordinateMode, NearestMode, ResizeAttrs, ResizeMode};
    let cases: [(&[usize], &[usize], NearestMode, bool); 6] = [
        (&[1, 3, 5, 7], &[1, 3, 10, 14], NearestMode::Floor, true),
        (&[1, 2, 3, 4], &[1, 2, 9, 32], NearestMode::Floor, true),
        (&[2, 4, 3], &[2, 8, 48], NearestMode::Floor, true),
        // round_prefer_ceil with asymmetric reads o/2 rounded: not a repetition
        (
            &[1, 3, 5, 7],
            &[1, 3, 10, 14],
            NearestMode::RoundPreferCeil,
            false,
        ),
        (&[1, 2, 4, 5], &[1, 2, 6, 5], NearestMode::Floor, false),
        (&[1, 2, 8, 8], &[1, 2, 4, 4], NearestMode::Floor, false),
    ];
    for (input, sizes, nearest, repeats) in cases {
        let scales = sizes
            .iter()
            .zip(input)
            .map(|(&o, &i)| F32(o as f32 / i as f32))
            .collect();
        let attrs = ResizeAttrs {
            sizes: sizes.to_vec(),
            scales,
            mode: ResizeMode::Nearest(nearest),
            coordinate: CoordinateMode::Asymmetric,
            ..ResizeAttrs::default()
        };
        let m = one_op(Op::Resize(attrs), &[t(input)], &[]);
        let what = format!("{nearest:?} {input:?} -> {sizes:?}");
        check_against_interp(&what, &m, &random_inputs(&m, 5), 0.0);
        let p = smelt_passes::lower::lower(&m, &m.funcs[0]).expect("lowers");
        assert_eq!(
            p.dump_loops().contains("resize_repeat"),
            repeats,
            "{what}:\n{}",
            p.dump_loops()
        );
    }
}

/// A chain of `f32` elementwise ops, each read only by the next (YOLO's box decode:
/// `mul → sub → add → mul`), compiles to one kernel — the first op with the others as
/// post-ops, the accumulator on either side of a binary link, operands broadcast — and
/// gives the interpreter's results; a link with a second reader, or a binary op whose
/// both operands are chained, ends or keeps one chain (the other operand is computed).
#[test]
fn elementwise_chains_compute_in_one_kernel() {
    let mut m = Module::default();
    let mut b = FuncBuilder::new(&mut m, "f");
    let x = b.param("x", t(&[2, 3, 7, 5]));
    let scale = b
        .constant("scale", t(&[1]), &random_f32(3, 1, 0.5, 2.0))
        .expect("constant");
    let grid = b
        .constant("grid", t(&[1, 1, 7, 5]), &random_f32(4, 35, -1.0, 1.0))
        .expect("constant");
    let op = |b: &mut FuncBuilder, op: Op, args: &[Value]| b.op(op, args).expect("types");
    let m0 = op(&mut b, Op::Binary(BinaryOp::Mul), &[x, scale]);
    let s0 = op(&mut b, Op::Binary(BinaryOp::Sub), &[grid, m0]); // accumulator on the right
    let e0 = op(&mut b, Op::Unary(UnaryOp::Exp), &[s0]);
    let a0 = op(&mut b, Op::Binary(BinaryOp::Add), &[e0, grid]);
    // a second chain whose last link adds the first chain's end: that operand is
    // computed, the chain continues from its own first op
    let n1 = op(&mut b, Op::Unary(UnaryOp::Neg), &[x]);
    let d1 = op(&mut b, Op::Binary(BinaryOp::Div), &[n1, scale]);
    let sum = op(&mut b, Op::Binary(BinaryOp::Add), &[a0, d1]);
    // a value with two readers ends its chain
    let r = op(&mut b, Op::Unary(UnaryOp::Relu), &[sum]);
    let twice = op(&mut b, Op::Binary(BinaryOp::Mul), &[r, r]);
    b.finish(&[("y", twice)]);
    check("elementwise chains", &m);
    let exe = smelt::Executable::compile(&m, None, &jit_util::opts()).expect("compiles");
    let names: Vec<String> = exe.kernels().iter().map(|k| k.name.clone()).collect();
    // m0 → s0 → e0 → a0 → sum → r (one kernel, `sum` reading d1), n1 → d1, twice
    assert_eq!(names.len(), 3, "{names:?}");
    assert_eq!(
        names.iter().filter(|n| n.ends_with("_fused")).count(),
        2,
        "{names:?}"
    );
}
