//! The native activation-rows routines (SiLU and sigmoid; AVX2, AVX-512) against the
//! activation in f64 and the scalar references: rows of 16 and 32 lanes with and
//! without a bias, values across the exponential's range and its special cases, guard
//! regions untouched.

use smelt::ir::weights::random_f32;
use smelt::microkernels::{self, ActivationRowsFn};

/// Which activation a routine applies.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Act {
    Silu,
    Sigmoid,
    Gelu,
}

impl Act {
    /// The activation in f64 (GELU's erf the interpreter's, accurate to f64).
    fn f64(self, v: f64) -> f64 {
        match self {
            Act::Silu => v / (1.0 + (-v).exp()),
            Act::Sigmoid => 1.0 / (1.0 + (-v).exp()),
            Act::Gelu => smelt::ir::UnaryOp::Gelu {
                approximate: smelt::ir::op::GeluApproximation::None,
            }
            .eval(v),
        }
    }

    /// How far a routine may be from the f64 activation at `want`, for an input `x`:
    /// 2e-6 relative for the exponential forms; GELU's erf polynomial is ≈ 1e-6 absolute,
    /// times |x|/2.
    fn tolerance(self, x: f64, want: f64) -> f64 {
        match self {
            Act::Gelu => 2e-6 * x.abs().max(1.0),
            Act::Silu | Act::Sigmoid => 2e-6 * want.abs().max(1e-3),
        }
    }
}

/// The NaN every guard element holds.
const POISON: u32 = 0x7fc0_5117;
/// Guard elements before and after every buffer.
const GUARD: usize = 21;

/// The routines this host runs for `act`, the reference first. On x86-64 the AVX2
/// routine is required (the test machines have it); AVX-512 runs where the CPU has it.
fn routines(act: Act) -> Vec<(&'static str, ActivationRowsFn)> {
    let reference: ActivationRowsFn = match act {
        Act::Silu => microkernels::silu_rows_reference,
        Act::Sigmoid => microkernels::sigmoid_rows_reference,
        Act::Gelu => microkernels::gelu_rows_reference,
    };
    let mut v: Vec<(&'static str, ActivationRowsFn)> = vec![("reference", reference)];
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            microkernels::has_avx2_fma(),
            "an x86-64 test machine without AVX2 + FMA"
        );
        let (avx2, avx512): (ActivationRowsFn, ActivationRowsFn) = match act {
            Act::Silu => (microkernels::silu_rows_avx2, microkernels::silu_rows_avx512),
            Act::Sigmoid => (
                microkernels::sigmoid_rows_avx2,
                microkernels::sigmoid_rows_avx512,
            ),
            Act::Gelu => (microkernels::gelu_rows_avx2, microkernels::gelu_rows_avx512),
        };
        v.push(("avx2", avx2));
        if microkernels::has_avx512f() {
            v.push(("avx512", avx512));
        }
    }
    v
}

/// `f` on `values` (rows of `lanes`) with `bias`, the guards checked.
fn run(
    name: &str,
    f: ActivationRowsFn,
    values: &[f32],
    bias: Option<&[f32]>,
    lanes: usize,
) -> Vec<f32> {
    let n = values.len();
    let mut buf = vec![f32::from_bits(POISON); n + 2 * GUARD];
    buf[GUARD..GUARD + n].copy_from_slice(values);
    let mut b = vec![f32::from_bits(POISON); lanes + 2 * GUARD];
    if let Some(bias) = bias {
        b[GUARD..GUARD + lanes].copy_from_slice(bias);
    }
    let bias_ptr = if bias.is_some() {
        // SAFETY: `lanes` elements after the guard.
        unsafe { b.as_ptr().add(GUARD) }
    } else {
        std::ptr::null()
    };
    // SAFETY: `buf` holds the rows after its guard, `b` the bias after its guard.
    unsafe {
        f(
            buf.as_mut_ptr().add(GUARD),
            bias_ptr,
            (n / lanes) as i64,
            lanes as i64,
        )
    };
    for (i, v) in buf.iter().enumerate() {
        if !(GUARD..GUARD + n).contains(&i) {
            assert_eq!(v.to_bits(), POISON, "{name}: wrote outside the rows at {i}");
        }
    }
    assert!(b[..GUARD]
        .iter()
        .chain(&b[GUARD + lanes..])
        .all(|v| v.to_bits() == POISON));
    buf[GUARD..GUARD + n].to_vec()
}

#[test]
fn routines_match_the_f64_activation_across_the_range() {
    for act in [Act::Silu, Act::Sigmoid, Act::Gelu] {
        check_range(act);
    }
}

fn check_range(act: Act) {
    let mut ran = Vec::new();
    for lanes in [16usize, 32] {
        for rows in [1usize, 3, 28] {
            for scale in [1.0f32, 12.0, 90.0] {
                let values: Vec<f32> =
                    random_f32(lanes as u64 + rows as u64, rows * lanes, -1.0, 1.0)
                        .into_iter()
                        .map(|v| v * scale)
                        .collect();
                let bias = random_f32(7, lanes, -2.0, 2.0);
                for with_bias in [false, true] {
                    for (name, f) in routines(act) {
                        let b = with_bias.then_some(bias.as_slice());
                        let got = run(name, f, &values, b, lanes);
                        for (i, (&g, &v)) in got.iter().zip(&values).enumerate() {
                            let x = v as f64
                                + if with_bias {
                                    bias[i % lanes] as f64
                                } else {
                                    0.0
                                };
                            let want = act.f64(x);
                            let tol = act.tolerance(x, want);
                            assert!(
                                (g as f64 - want).abs() <= tol,
                                "{act:?} {name} lanes {lanes} x {x}: {g}, want {want}"
                            );
                        }
                        if !ran.contains(&name) {
                            ran.push(name);
                        }
                    }
                }
            }
        }
    }
    eprintln!("{act:?}-rows routines checked: {}", ran.join(", "));
    if cfg!(target_arch = "x86_64") {
        assert!(ran.contains(&"avx2"), "the AVX2 routine ran: {ran:?}");
    }
}

#[test]
fn special_values_follow_the_interpreter_and_bad_shapes_touch_nothing() {
    let mut values = vec![0.0f32; 16];
    values[..6].copy_from_slice(&[
        f32::NEG_INFINITY,
        f32::INFINITY,
        f32::NAN,
        -100.0,
        100.0,
        -0.0,
    ]);
    for (name, f) in routines(Act::Sigmoid) {
        let got = run(name, f, &values, None, 16);
        assert_eq!(got[0], 0.0, "{name}: sigmoid(-inf) = {}", got[0]);
        assert_eq!(got[1], 1.0, "{name}");
        assert!(got[2].is_nan(), "{name}");
        assert!(got[3].abs() < 1e-30, "{name}: sigmoid(-100) = {}", got[3]);
        assert_eq!(got[4], 1.0, "{name}");
        assert_eq!(got[5], 0.5, "{name}");
    }
    for (name, f) in routines(Act::Gelu) {
        let got = run(name, f, &values, None, 16);
        assert!(got[0].is_nan(), "{name}: gelu(-inf) = {}", got[0]);
        assert_eq!(got[1], f32::INFINITY, "{name}");
        assert!(got[2].is_nan(), "{name}");
        assert!(got[3].abs() < 1e-30, "{name}: gelu(-100) = {}", got[3]);
        assert_eq!(got[4], 100.0, "{name}");
        assert_eq!(got[5], 0.0, "{name}");
    }
    for (name, f) in routines(Act::Silu) {
        let got = run(name, f, &values, None, 16);
        assert!(got[0].is_nan(), "{name}: silu(-inf) = {}", got[0]);
        assert_eq!(got[1], f32::INFINITY, "{name}");
        assert!(got[2].is_nan(), "{name}");
        assert!(got[3].abs() < 1e-30, "{name}: silu(-100) = {}", got[3]);
        assert_eq!(got[4], 100.0, "{name}");
        assert_eq!(got[5], 0.0, "{name}");
        for (rows, lanes) in [(1i64, 8i64), (1, 0), (-1, 16), (2, 24)] {
            let mut buf = [f32::from_bits(POISON); 64];
            // SAFETY: a record the contract refuses touches nothing.
            unsafe { f(buf.as_mut_ptr(), std::ptr::null(), rows, lanes) };
            assert!(
                buf.iter().all(|v| v.to_bits() == POISON),
                "{name} rows {rows} lanes {lanes}"
            );
        }
    }
}
