//! The native Winograd row routines (AVX2; AVX-512 where the host has it) and their
//! scalar references against the contracts computed here in f64, F(2×2) and F(4×4),
//! one to three tiles. Output rows: every count of stored rows and columns (partial last
//! tiles), 16- and 32-lane tiles of the product (the other half and the gaps poisoned).
//! Input rows: overlapping tiles of a padded row of channel blocks, 16 or more elements
//! between the transformed tiles. Every element a routine may not read is a NaN that
//! would reach the results; the routines must equal the reference bit for bit (the same
//! sums in the same order), the reference the f64 transform closely, and nothing outside
//! the contract's elements may be written. Shapes the contracts refuse touch nothing.

use smelt::ir::loops::winograd::{WinogradInputRow, WinogradOutputRow, AT_F2, AT_F4, BT_F2, BT_F4};
use smelt::ir::weights::random_f32;
use smelt::microkernels::{self, WinogradInputRowFn, WinogradOutputRowFn};

/// The NaN every element that must not be read (or written) holds.
const POISON: u32 = 0x7fc0_3a11;
/// Guard elements before and after every buffer.
const GUARD: usize = 29;
/// Lanes of a call.
const LANES: usize = 16;

/// The reference and the native routines of one kind this host runs, the reference
/// first; on x86-64 the AVX2 routine is required (the test machines have it).
#[cfg(target_arch = "x86_64")]
fn runnable<F>(reference: F, avx2: F, avx512: F) -> Vec<(&'static str, F)> {
    assert!(
        microkernels::has_avx2_fma(),
        "an x86-64 test machine without AVX2 + FMA"
    );
    let mut v = vec![("reference", reference), ("avx2", avx2)];
    if microkernels::has_avx512f() {
        v.push(("avx512", avx512));
    }
    v
}

/// The output row routines this host runs.
fn routines() -> Vec<(&'static str, WinogradOutputRowFn)> {
    #[cfg(target_arch = "x86_64")]
    return runnable(
        microkernels::winograd_output_row_reference,
        microkernels::winograd_output_row_avx2,
        microkernels::winograd_output_row_avx512,
    );
    #[cfg(not(target_arch = "x86_64"))]
    vec![(
        "reference",
        microkernels::winograd_output_row_reference as _,
    )]
}

fn poison() -> f32 {
    f32::from_bits(POISON)
}

/// `Aᵀ` of the form with `alpha` inputs, as f64 rows.
fn at(alpha: i64) -> Vec<Vec<f64>> {
    match alpha {
        4 => AT_F2
            .iter()
            .map(|r| r.iter().map(|&v| v as f64).collect())
            .collect(),
        _ => AT_F4
            .iter()
            .map(|r| r.iter().map(|&v| v as f64).collect())
            .collect(),
    }
}

/// The contract in f64: `out` values by (row, column, lane) of the stored runs.
fn expected(r: &WinogradOutputRow, m: &[f32]) -> Vec<((usize, usize, usize), f64)> {
    let a = r.alpha as usize;
    let mu = a - 2;
    let at = at(r.alpha);
    let mut v = Vec::new();
    for t in 0..r.tiles as usize {
        for lane in 0..LANES {
            let mv = |xi: usize| m[xi * r.m_plane as usize + t * r.m_tile as usize + lane] as f64;
            for y in 0..r.rows as usize {
                for j in 0..mu {
                    let c = t * mu + j;
                    if c >= r.cols as usize {
                        continue;
                    }
                    let mut sum = 0.0;
                    for k in 0..a {
                        for l in 0..a {
                            sum += at[y][k] * mv(k * a + l) * at[j][l];
                        }
                    }
                    v.push(((y, c, lane), sum));
                }
            }
        }
    }
    v
}

fn call(f: WinogradOutputRowFn, r: &WinogradOutputRow, m: &[f32], out: &mut [f32]) {
    // SAFETY: the buffers hold the record's footprints past their guards (the callers
    // size them so); the routine runs on this host.
    unsafe {
        f(
            m.as_ptr().add(GUARD),
            out.as_mut_ptr().add(GUARD),
            r.alpha,
            r.tiles,
            r.m_plane,
            r.m_tile,
            r.rows,
            r.cols,
            r.out_row,
        )
    }
}

#[test]
fn routines_equal_the_contract_and_touch_only_its_elements() {
    let mut calls = 0;
    let mut reference: Vec<Vec<u32>> = Vec::new();
    for (name, f) in routines() {
        let mut case = 0;
        for alpha in [4i64, 6] {
            let mu = alpha - 2;
            for tiles in 1..=3i64 {
                for m_tile in [16i64, 32] {
                    for rows in 0..=mu {
                        for cols in [(tiles - 1) * mu + 1, tiles * mu] {
                            let m_plane = tiles * m_tile + 5;
                            let out_row = cols * LANES as i64 + 3;
                            let r = WinogradOutputRow {
                                alpha,
                                tiles,
                                m_plane,
                                m_tile,
                                rows,
                                cols,
                                out_row,
                            };
                            let what = format!("{name} {r:?}");
                            let [ms, os] = r.footprints().expect("a valid shape");
                            // m: only the contract's reads hold values
                            let values = random_f32(7 + case as u64, ms as usize, -2.0, 2.0);
                            let mut m = vec![poison(); ms as usize + 2 * GUARD];
                            for xi in 0..(alpha * alpha) as usize {
                                for t in 0..tiles as usize {
                                    for lane in 0..LANES {
                                        let i = xi * m_plane as usize + t * m_tile as usize + lane;
                                        m[GUARD + i] = values[i];
                                    }
                                }
                            }
                            let mut out = vec![poison(); os as usize + 2 * GUARD];
                            call(f, &r, &m, &mut out);
                            let body = &m[GUARD..GUARD + ms as usize];
                            let want = expected(&r, body);
                            let mut stored = vec![false; out.len()];
                            for &((y, c, lane), v) in &want {
                                let i = GUARD + y * out_row as usize + c * LANES + lane;
                                stored[i] = true;
                                let got = out[i] as f64;
                                assert!(
                                    (got - v).abs() <= 1e-5 * (1.0 + v.abs()),
                                    "{what}: ({y}, {c}, {lane}) {got} against {v}"
                                );
                            }
                            for (i, (&o, &s)) in out.iter().zip(&stored).enumerate() {
                                if !s {
                                    assert_eq!(o.to_bits(), POISON, "{what}: element {i} written");
                                }
                            }
                            let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
                            match reference.get(case) {
                                Some(want) => {
                                    assert_eq!(&bits, want, "{what}: not the reference's bits")
                                }
                                None => reference.push(bits),
                            }
                            case += 1;
                            calls += 1;
                        }
                    }
                }
            }
        }
    }
    // 2 forms × 3 tile counts × 2 tile strides × (3 or 5 row counts) × 2 column counts
    let per_routine = 3 * 2 * (3 + 5) * 2;
    assert_eq!(calls % per_routine, 0);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        calls,
        (2 + usize::from(microkernels::has_avx512f())) * per_routine,
        "a native routine did not run"
    );
    assert!(calls >= per_routine);
}

#[test]
fn shapes_the_contract_refuses_touch_nothing() {
    let valid = WinogradOutputRow {
        alpha: 6,
        tiles: 2,
        m_plane: 40,
        m_tile: 16,
        rows: 4,
        cols: 8,
        out_row: 128,
    };
    assert!(valid.is_valid());
    let refused = [
        WinogradOutputRow { alpha: 5, ..valid },
        WinogradOutputRow { rows: 5, ..valid },
        WinogradOutputRow { cols: 9, ..valid },
        WinogradOutputRow {
            out_row: 127,
            ..valid
        },
        WinogradOutputRow { tiles: -1, ..valid },
        WinogradOutputRow {
            m_tile: -16,
            ..valid
        },
    ];
    for r in refused {
        assert!(!r.is_valid() && r.footprints().is_none(), "{r:?}");
        for (name, f) in routines() {
            let m = vec![poison(); 2 * GUARD + 2000];
            let mut out = vec![poison(); 2 * GUARD + 2000];
            call(f, &r, &m, &mut out);
            assert!(
                out.iter().all(|v| v.to_bits() == POISON),
                "{name} {r:?}: wrote"
            );
        }
    }
}

/// The input row routines this host runs.
fn input_routines() -> Vec<(&'static str, WinogradInputRowFn)> {
    #[cfg(target_arch = "x86_64")]
    return runnable(
        microkernels::winograd_input_row_reference,
        microkernels::winograd_input_row_avx2,
        microkernels::winograd_input_row_avx512,
    );
    #[cfg(not(target_arch = "x86_64"))]
    vec![("reference", microkernels::winograd_input_row_reference as _)]
}

/// `Bᵀ` of the form with `alpha` inputs, as f64 rows.
fn bt(alpha: i64) -> Vec<Vec<f64>> {
    match alpha {
        4 => BT_F2
            .iter()
            .map(|r| r.iter().map(|&v| v as f64).collect())
            .collect(),
        _ => BT_F4
            .iter()
            .map(|r| r.iter().map(|&v| v as f64).collect())
            .collect(),
    }
}

fn call_input(f: WinogradInputRowFn, r: &WinogradInputRow, x: &[f32], v: &mut [f32]) {
    // SAFETY: the buffers hold the record's footprints past their guards (the callers
    // size them so); the routine runs on this host.
    unsafe {
        f(
            x.as_ptr().add(GUARD),
            v.as_mut_ptr().add(GUARD),
            r.alpha,
            r.tiles,
            r.x_row,
            r.x_tile,
            r.v_plane,
            r.v_tile,
        )
    }
}

#[test]
fn input_routines_equal_the_contract_and_touch_only_its_elements() {
    let mut calls = 0;
    let mut reference: Vec<Vec<u32>> = Vec::new();
    for (name, f) in input_routines() {
        let mut case = 0;
        for alpha in [4i64, 6] {
            let mu = alpha - 2;
            for tiles in 1..=3i64 {
                for v_tile in [16i64, 48] {
                    // a padded row of channel blocks: tiles overlap by 2 columns, and
                    // 3 columns past the last tile's are never read
                    let cols = tiles * mu + 2 + 3;
                    let x_row = cols * LANES as i64;
                    let r = WinogradInputRow {
                        alpha,
                        tiles,
                        x_row,
                        x_tile: mu * LANES as i64,
                        v_plane: tiles * v_tile + 7,
                        v_tile,
                    };
                    let what = format!("{name} {r:?}");
                    let [xs, vs] = r.footprints().expect("a valid shape");
                    let a = alpha as usize;
                    // x: only the tiles' windows hold values
                    let values = random_f32(40 + case as u64, xs as usize, -2.0, 2.0);
                    let mut x = vec![poison(); xs as usize + 2 * GUARD];
                    let window = |t: usize, i: usize, j: usize| {
                        i * x_row as usize + t * r.x_tile as usize + j * LANES
                    };
                    for t in 0..tiles as usize {
                        for i in 0..a {
                            for j in 0..a {
                                for lane in 0..LANES {
                                    let at = window(t, i, j) + lane;
                                    x[GUARD + at] = values[at];
                                }
                            }
                        }
                    }
                    let mut v = vec![poison(); vs as usize + 2 * GUARD];
                    call_input(f, &r, &x, &mut v);
                    let bt = bt(alpha);
                    let mut written = vec![false; v.len()];
                    for t in 0..tiles as usize {
                        for lane in 0..LANES {
                            for k in 0..a {
                                for l in 0..a {
                                    let mut sum = 0.0;
                                    for i in 0..a {
                                        for j in 0..a {
                                            let d = values[window(t, i, j) + lane] as f64;
                                            sum += bt[k][i] * d * bt[l][j];
                                        }
                                    }
                                    let at = GUARD
                                        + (k * a + l) * r.v_plane as usize
                                        + t * v_tile as usize
                                        + lane;
                                    written[at] = true;
                                    let got = v[at] as f64;
                                    assert!(
                                        (got - sum).abs() <= 1e-5 * (1.0 + sum.abs()),
                                        "{what}: tile {t} ξ {k},{l} lane {lane}: {got} against {sum}"
                                    );
                                }
                            }
                        }
                    }
                    for (i, (&o, &w)) in v.iter().zip(&written).enumerate() {
                        if !w {
                            assert_eq!(o.to_bits(), POISON, "{what}: element {i} written");
                        }
                    }
                    let bits: Vec<u32> = v.iter().map(|e| e.to_bits()).collect();
                    match reference.get(case) {
                        Some(want) => assert_eq!(&bits, want, "{what}: not the reference's bits"),
                        None => reference.push(bits),
                    }
                    case += 1;
                    calls += 1;
                }
            }
        }
    }
    // 2 forms × 3 tile counts × 2 tile strides
    let per_routine = 2 * 3 * 2;
    assert_eq!(calls % per_routine, 0);
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        calls,
        (2 + usize::from(microkernels::has_avx512f())) * per_routine,
        "a native routine did not run"
    );
    assert!(calls >= per_routine);
}

#[test]
fn input_shapes_the_contract_refuses_touch_nothing() {
    let valid = WinogradInputRow {
        alpha: 6,
        tiles: 2,
        x_row: 160,
        x_tile: 64,
        v_plane: 40,
        v_tile: 16,
    };
    assert!(valid.is_valid());
    let refused = [
        WinogradInputRow { alpha: 3, ..valid },
        WinogradInputRow { tiles: -1, ..valid },
        WinogradInputRow { x_row: -1, ..valid },
        WinogradInputRow {
            v_tile: -16,
            ..valid
        },
    ];
    for r in refused {
        assert!(!r.is_valid() && r.footprints().is_none(), "{r:?}");
        for (name, f) in input_routines() {
            let x = vec![poison(); 2 * GUARD + 4000];
            let mut v = vec![poison(); 2 * GUARD + 4000];
            call_input(f, &r, &x, &mut v);
            assert!(
                v.iter().all(|e| e.to_bits() == POISON),
                "{name} {r:?}: wrote"
            );
        }
    }
}
