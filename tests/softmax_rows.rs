//! The native softmax-row routines (AVX2, AVX-512) against an f64 softmax and the scalar
//! reference: rows of every length around the vector widths, in place and not, with
//! guard regions that must come back untouched; NaN and all-`−∞` rows give NaN.

use smelt::ir::weights::random_f32;
use smelt::microkernels::{self, SoftmaxRowFn};

/// The NaN every guard element holds.
const POISON: u32 = 0x7fc0_cafe;
/// Guard elements before and after every buffer.
const GUARD: usize = 19;

/// The routines this host runs, the reference first. On x86-64 the AVX2 routine is
/// required (the test machines have it); AVX-512 runs where the CPU has it.
fn routines() -> Vec<(&'static str, SoftmaxRowFn)> {
    let mut v: Vec<(&'static str, SoftmaxRowFn)> =
        vec![("reference", microkernels::softmax_row_reference)];
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            microkernels::has_avx2_fma(),
            "an x86-64 test machine without AVX2 + FMA"
        );
        v.push(("avx2", microkernels::softmax_row_avx2));
        if microkernels::has_avx512f() {
            v.push(("avx512", microkernels::softmax_row_avx512));
        }
    }
    v
}

/// Runs `f` on `row` (in place when `in_place`), returning the output and checking the
/// guards.
fn run(name: &str, f: SoftmaxRowFn, row: &[f32], in_place: bool) -> Vec<f32> {
    let n = row.len();
    let mut x = vec![f32::from_bits(POISON); n + 2 * GUARD];
    x[GUARD..GUARD + n].copy_from_slice(row);
    let mut out = vec![f32::from_bits(POISON); n + 2 * GUARD];
    // SAFETY: `x[GUARD..GUARD + n]` holds the row and `out` as many elements; in place,
    // the routine reads and writes the same run, which the contract allows.
    unsafe {
        let xp = x.as_mut_ptr().add(GUARD);
        if in_place {
            f(xp, xp, n as i64);
        } else {
            f(xp, out.as_mut_ptr().add(GUARD), n as i64);
        }
    }
    let result = if in_place { x } else { out };
    for (i, v) in result.iter().enumerate() {
        if !(GUARD..GUARD + n).contains(&i) {
            assert_eq!(v.to_bits(), POISON, "{name} len {n}: wrote outside at {i}");
        }
    }
    result[GUARD..GUARD + n].to_vec()
}

#[test]
fn routines_match_an_f64_softmax_on_rows_of_every_length() {
    let mut ran = Vec::new();
    for (seed, len) in [
        1usize, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 128, 197, 384,
    ]
    .into_iter()
    .enumerate()
    {
        for scale in [1.0f32, 30.0] {
            let row: Vec<f32> = random_f32(seed as u64 + 7, len, -1.0, 1.0)
                .into_iter()
                .map(|v| v * scale)
                .collect();
            let max = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v as f64));
            let sum: f64 = row.iter().map(|&v| (v as f64 - max).exp()).sum();
            for (name, f) in routines() {
                for in_place in [false, true] {
                    let got = run(name, f, &row, in_place);
                    for (i, (&g, &v)) in got.iter().zip(&row).enumerate() {
                        let want = (v as f64 - max).exp() / sum;
                        assert!(
                            (g as f64 - want).abs() <= 1e-6 * want.max(1e-30) + 1e-12,
                            "{name} len {len} scale {scale}: out[{i}] = {g}, want {want}"
                        );
                    }
                }
                if !ran.contains(&name) {
                    ran.push(name);
                }
            }
        }
    }
    eprintln!("softmax-row routines checked: {}", ran.join(", "));
    if cfg!(target_arch = "x86_64") {
        assert!(ran.contains(&"avx2"), "the AVX2 routine ran: {ran:?}");
    }
}

#[test]
fn nan_and_all_negative_infinity_rows_give_nan_and_empty_rows_touch_nothing() {
    for len in [5usize, 16, 40] {
        let mut with_nan = random_f32(3, len, -1.0, 1.0);
        with_nan[len / 2] = f32::NAN;
        let all_neg_inf = vec![f32::NEG_INFINITY; len];
        for (name, f) in routines() {
            for row in [&with_nan, &all_neg_inf] {
                let got = run(name, f, row, false);
                assert!(got.iter().all(|v| v.is_nan()), "{name} len {len}: {got:?}");
            }
            // a row of one `−∞` among finite values gives it exactly 0
            let mut one = random_f32(4, len, -1.0, 1.0);
            one[0] = f32::NEG_INFINITY;
            let got = run(name, f, &one, false);
            assert_eq!(got[0], 0.0, "{name} len {len}");
            let total: f64 = got.iter().map(|&v| v as f64).sum();
            assert!((total - 1.0).abs() < 1e-5, "{name} len {len}: sum {total}");
        }
    }
    for (name, f) in routines() {
        for len in [0i64, -3] {
            let mut buf = [f32::from_bits(POISON); 8];
            // SAFETY: an empty or negative length touches nothing.
            unsafe { f(buf.as_ptr(), buf.as_mut_ptr(), len) };
            assert!(
                buf.iter().all(|v| v.to_bits() == POISON),
                "{name} len {len}"
            );
        }
    }
}
