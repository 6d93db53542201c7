//! The native store-rows routines (identity, ReLU and hard-swish; the AVX2 routine,
//! which AVX-512 hosts use too) against the contract computed here and the scalar references: rows
//! of 16, 32 and 64 lanes with and without a bias and a residual, written elsewhere or
//! in place, NaN, ±0 and ±∞ among the values, guard regions untouched, and records the
//! contract refuses touching nothing.

mod common;

use smelt::ir::loops::StoreActivation as Act;
use smelt::ir::weights::random_f32;
use smelt::microkernels::{self, StoreRowsFn};

/// The NaN every guard element holds.
const POISON: u32 = 0x7fc0_5707;
/// Guard elements before and after every buffer.
const GUARD: usize = 19;

/// The routines this host runs, the reference first, for `act`. On x86-64 the AVX2
/// routine is required (the test machines have it).
fn routines(act: Act) -> Vec<(&'static str, StoreRowsFn)> {
    let mut v: Vec<(&'static str, StoreRowsFn)> =
        vec![("reference", microkernels::store_rows_reference(act))];
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            microkernels::has_avx2_fma(),
            "an x86-64 test machine without AVX2 + FMA"
        );
        v.push(("avx2", microkernels::store_rows_avx2(act)));
    }
    v
}

/// `n` values, every seventh a special one (NaN, ±0, ±∞, a negative).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let special = [f32::NAN, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY, -2.5];
    random_f32(seed, n, -4.0, 4.0)
        .into_iter()
        .enumerate()
        .map(|(i, v)| match i % 7 {
            3 => special[(i / 7) % special.len()],
            _ => v,
        })
        .collect()
}

/// `data` between two guard regions of poison.
fn guarded(data: &[f32]) -> Vec<f32> {
    let poison = f32::from_bits(POISON);
    let mut v = vec![poison; GUARD];
    v.extend_from_slice(data);
    v.extend(std::iter::repeat_n(poison, GUARD));
    v
}

/// The guard regions of `buf` are poison still.
fn guards_intact(buf: &[f32]) -> bool {
    let n = buf.len();
    buf[..GUARD]
        .iter()
        .chain(&buf[n - GUARD..])
        .all(|v| v.to_bits() == POISON)
}

/// The contract, element by element, in this file's own words.
fn expected(sums: &[f32], bias: Option<&[f32]>, residual: Option<&[f32]>, act: Act) -> Vec<f32> {
    let lanes = bias.map_or(1, <[f32]>::len);
    (0..sums.len())
        .map(|i| {
            let mut v = sums[i];
            if let Some(b) = bias {
                v += b[i % lanes];
            }
            if let Some(r) = residual {
                v += r[i];
            }
            // the JIT's hard-swish: one fused multiply-add, clamps keeping a NaN
            common::store_activation(act, v)
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Where a call writes: a buffer of its own, or over its sums or its residual.
#[derive(Clone, Copy, Debug)]
enum Target {
    Apart,
    OverSums,
    OverResidual,
}

#[test]
fn routines_equal_the_contract_bit_for_bit_and_stay_inside() {
    let mut calls = 0;
    for act in Act::ALL {
        for (name, f) in routines(act) {
            for (rows, lanes) in [(0, 16), (1, 16), (7, 16), (3, 32), (5, 64)] {
                let n = rows * lanes;
                for with_bias in [false, true] {
                    for with_residual in [false, true] {
                        for target in [Target::Apart, Target::OverSums, Target::OverResidual] {
                            if matches!(target, Target::OverResidual) && !with_residual {
                                continue;
                            }
                            let what = format!(
                                "{name} {act:?} {rows}x{lanes} bias={with_bias} \
                                 residual={with_residual} {target:?}"
                            );
                            let sums = values(n, 1 + n as u64);
                            let bias = values(lanes, 2);
                            let residual = values(n, 3);
                            let want = expected(
                                &sums,
                                with_bias.then_some(&bias[..]),
                                with_residual.then_some(&residual[..]),
                                act,
                            );
                            let mut sums_buf = guarded(&sums);
                            let bias_buf = guarded(&bias);
                            let mut residual_buf = guarded(&residual);
                            let mut out_buf = guarded(&vec![7.0; n]);
                            let sums_ptr = sums_buf.as_mut_ptr();
                            let residual_ptr = residual_buf.as_mut_ptr();
                            let out_ptr = match target {
                                Target::Apart => out_buf.as_mut_ptr(),
                                Target::OverSums => sums_ptr,
                                Target::OverResidual => residual_ptr,
                            };
                            // SAFETY: every run the contract names is inside its buffer,
                            // past its guard; `out` is apart or exactly over one input,
                            // as the contract allows; the routine runs on this host.
                            unsafe {
                                f(
                                    sums_ptr.add(GUARD),
                                    match with_bias {
                                        true => bias_buf.as_ptr().add(GUARD),
                                        false => std::ptr::null(),
                                    },
                                    match with_residual {
                                        true => residual_ptr.add(GUARD),
                                        false => std::ptr::null(),
                                    },
                                    out_ptr.add(GUARD),
                                    rows as i64,
                                    lanes as i64,
                                )
                            };
                            let written = match target {
                                Target::Apart => &out_buf,
                                Target::OverSums => &sums_buf,
                                Target::OverResidual => &residual_buf,
                            };
                            assert_eq!(bits(&written[GUARD..GUARD + n]), bits(&want), "{what}");
                            for buf in [&sums_buf, &bias_buf, &residual_buf, &out_buf] {
                                assert!(guards_intact(buf), "{what}: a guard was written");
                            }
                            calls += 1;
                        }
                    }
                }
            }
        }
    }
    // three activations × (reference + AVX2 on x86-64) × 5 shapes × 10 combinations
    let per_routine = 5 * 10;
    assert_eq!(calls % per_routine, 0);
    assert!(
        calls >= Act::ALL.len() * per_routine,
        "only {calls} calls ran"
    );
}

#[test]
fn records_the_contract_refuses_touch_nothing() {
    for act in Act::ALL {
        for (name, f) in routines(act) {
            for (rows, lanes) in [(-1, 16), (1, 0), (1, 12), (1, -16), (2, 8)] {
                let sums = guarded(&[1.5; 64]);
                let mut out = guarded(&[7.0; 64]);
                // SAFETY: a record the contract says touches nothing; the buffers are
                // larger than any run it could name anyway.
                unsafe {
                    f(
                        sums.as_ptr().add(GUARD),
                        std::ptr::null(),
                        std::ptr::null(),
                        out.as_mut_ptr().add(GUARD),
                        rows,
                        lanes,
                    )
                };
                assert!(
                    out[GUARD..GUARD + 64].iter().all(|&v| v == 7.0) && guards_intact(&out),
                    "{name} {act:?}: {rows} rows of {lanes} wrote"
                );
            }
        }
    }
}

/// The store-planes routines this host runs, the reference first, for `act`.
fn plane_routines(act: Act) -> Vec<(&'static str, microkernels::StorePlanesFn)> {
    let mut v: Vec<(&'static str, microkernels::StorePlanesFn)> =
        vec![("reference", microkernels::store_planes_reference(act))];
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            microkernels::has_avx2_fma(),
            "an x86-64 test machine without AVX2 + FMA"
        );
        v.push(("avx2", microkernels::store_planes_avx2(act)));
    }
    v
}

/// The store-planes routines against the contract: whole 8×8 blocks and the pixels and
/// channels past them, partial channel counts, planes longer than the run, with and
/// without a bias, special values among the sums; every element of `out` the contract
/// does not name (between the runs, and the guards) keeps its value.
#[test]
fn plane_routines_equal_the_contract_bit_for_bit_and_stay_inside() {
    let mut calls = 0;
    for act in Act::ALL {
        for (name, f) in plane_routines(act) {
            for (pixels, channels, lanes, plane) in [
                (0, 16, 16, 4),
                (1, 16, 16, 1),
                (8, 16, 16, 8),
                (13, 16, 16, 20),
                (60, 15, 16, 2704),
                (7, 3, 16, 9),
                (17, 32, 32, 17),
                (9, 0, 16, 9),
            ] {
                for with_bias in [false, true] {
                    let what = format!(
                        "{name} {act:?} {pixels} pixels {channels}/{lanes} channels, \
                         plane {plane}, bias={with_bias}"
                    );
                    let sums = values(pixels * lanes, 5 + pixels as u64);
                    let bias = values(channels, 6);
                    let sums_buf = guarded(&sums);
                    let bias_buf = guarded(&bias);
                    let area = channels.max(1) * plane;
                    let mut out_buf = guarded(&vec![7.0; area]);
                    // SAFETY: the contract's elements lie inside the buffers, past their
                    // guards; `out` is apart from the sums; the routine runs on this host.
                    unsafe {
                        f(
                            sums_buf.as_ptr().add(GUARD),
                            match with_bias {
                                true => bias_buf.as_ptr().add(GUARD),
                                false => std::ptr::null(),
                            },
                            out_buf.as_mut_ptr().add(GUARD),
                            pixels as i64,
                            channels as i64,
                            lanes as i64,
                            plane as i64,
                        )
                    };
                    let mut want = vec![7.0f32; area];
                    for c in 0..channels {
                        let row: Vec<f32> = (0..pixels).map(|p| sums[p * lanes + c]).collect();
                        let b = with_bias.then(|| vec![bias[c]]);
                        let got = expected(&row, b.as_deref(), None, act);
                        want[c * plane..c * plane + pixels].copy_from_slice(&got);
                    }
                    assert_eq!(bits(&out_buf[GUARD..GUARD + area]), bits(&want), "{what}");
                    for buf in [&sums_buf, &bias_buf, &out_buf] {
                        assert!(guards_intact(buf), "{what}: a guard was written");
                    }
                    calls += 1;
                }
            }
        }
    }
    assert!(calls >= Act::ALL.len() * 8 * 2, "only {calls} calls ran");
}
