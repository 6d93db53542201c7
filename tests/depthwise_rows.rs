//! The native depthwise-row routines (AVX2, AVX-512) against the scalar reference, bit for
//! bit, over many shapes: every element outside the contract's index sets is a poisoned
//! NaN, and guard regions around every buffer must come back untouched.

use smelt::ir::loops::{DepthwiseRow, DEPTHWISE_MAX_TAPS};
use smelt::ir::weights::random_f32;
use smelt::microkernels::{self, DepthwiseRowFn};

/// The NaN every element outside a contract index set holds.
const POISON: u32 = 0x7fc0_beef;
/// Poisoned elements before and after every buffer.
const GUARD: usize = 37;

/// The routines this host runs, the reference first. On x86-64 the AVX2 routine is
/// required (the test machines have it); AVX-512 runs where the CPU has it.
fn routines() -> Vec<(&'static str, DepthwiseRowFn)> {
    let mut v: Vec<(&'static str, DepthwiseRowFn)> =
        vec![("reference", microkernels::depthwise_row_reference)];
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            microkernels::has_avx2_fma(),
            "an x86-64 test machine without AVX2 + FMA"
        );
        v.push(("avx2", microkernels::depthwise_row_avx2));
        if microkernels::has_avx512f() {
            v.push(("avx512", microkernels::depthwise_row_avx512));
        }
    }
    v
}

/// The x indices of the contract (relative to the call's x pointer).
fn x_indices(row: &DepthwiseRow) -> Vec<usize> {
    let mut v = Vec::new();
    for r in 0..row.rows {
        for t in 0..row.taps as usize {
            for q in 0..row.cols {
                v.push((r * row.row_stride + row.tap_offsets[t] + q) as usize);
            }
        }
    }
    v
}

/// A buffer of `len` elements plus guards, poisoned except at `live` (seeded values).
fn poisoned(len: usize, live: &[usize], seed: u64) -> Vec<f32> {
    let mut buf = vec![f32::from_bits(POISON); len + 2 * GUARD];
    let values = random_f32(seed, live.len(), -1.0, 1.0);
    for (&i, v) in live.iter().zip(values) {
        buf[GUARD + i] = v;
    }
    buf
}

/// Runs `row` through every routine on the same poisoned buffers; each result must equal
/// the reference's bits, and nothing outside `out[0..cols]` may change.
fn check(row: &DepthwiseRow, seed: u64, ran: &mut Vec<&'static str>) {
    let [xs, ws, os] = row.footprints().expect("a valid shape");
    let x = poisoned(xs as usize, &x_indices(row), seed);
    let w_live: Vec<usize> = (0..ws as usize).collect();
    let w = poisoned(ws as usize, &w_live, seed + 1);
    let mut want: Option<Vec<u32>> = None;
    for (name, f) in routines() {
        let mut out = vec![f32::from_bits(POISON); os as usize + 2 * GUARD];
        // SAFETY: the footprints bound every index of the contract, and each buffer holds
        // its footprint after GUARD elements.
        unsafe {
            f(
                x.as_ptr().add(GUARD),
                w.as_ptr().add(GUARD),
                out.as_mut_ptr().add(GUARD),
                row,
            )
        };
        let bits: Vec<u32> = out.iter().map(|v| v.to_bits()).collect();
        for (i, &b) in bits.iter().enumerate() {
            let inside = (GUARD..GUARD + row.cols as usize).contains(&i);
            if !inside {
                assert_eq!(b, POISON, "{name} {row}: wrote outside out at {i}");
            } else {
                assert_ne!(b, POISON, "{name} {row}: left out[{}] unwritten", i - GUARD);
                assert!(
                    f32::from_bits(b).is_finite(),
                    "{name} {row}: read a poisoned input"
                );
            }
        }
        match &want {
            None => want = Some(bits),
            Some(r) => assert_eq!(&bits, r, "{name} {row}: differs from the reference"),
        }
        if !ran.contains(&name) {
            ran.push(name);
        }
    }
}

#[test]
fn routines_match_the_reference_on_many_shapes() {
    let mut ran = Vec::new();
    let mut seed = 1;
    // columns around every vector and block boundary (8, 16, 64, 128 lanes)
    let cols = [
        1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 63, 64, 65, 80, 112, 113, 127, 128, 129, 160, 257,
    ];
    for &c in &cols {
        for (rows, taps) in [
            (1, 1),
            (3, 3),
            (5, 5),
            (2, 7),
            (7, DEPTHWISE_MAX_TAPS as i64),
        ] {
            seed += 1;
            let mut tap_offsets = [0i64; DEPTHWISE_MAX_TAPS];
            // offsets as a stride-2 phase split writes them (0, wq, 1, wq + 1, 2, …),
            // and unordered ones
            let wq = c + 3;
            for (t, o) in tap_offsets.iter_mut().enumerate().take(taps as usize) {
                *o = if seed % 2 == 0 {
                    (t as i64 % 2) * wq + t as i64 / 2
                } else {
                    ((t * 5 + 3) % 11) as i64
                };
            }
            let row = DepthwiseRow {
                cols: c,
                rows,
                row_stride: 2 * wq + 1,
                taps,
                tap_offsets,
            };
            check(&row, seed, &mut ran);
        }
    }
    eprintln!("depthwise-row routines checked: {}", ran.join(", "));
    if cfg!(target_arch = "x86_64") {
        assert!(ran.contains(&"avx2"), "the AVX2 routine ran: {ran:?}");
    }
}

#[test]
fn empty_and_invalid_records_touch_nothing_or_zero_the_row() {
    let base = DepthwiseRow {
        cols: 20,
        rows: 3,
        row_stride: 30,
        taps: 3,
        tap_offsets: [0, 1, 2, 0, 0, 0, 0, 0],
    };
    let cases = [
        (DepthwiseRow { taps: 9, ..base }, false),
        (DepthwiseRow { cols: -1, ..base }, false),
        (
            DepthwiseRow {
                row_stride: -30,
                ..base
            },
            false,
        ),
        (
            DepthwiseRow {
                tap_offsets: [0, -1, 2, 0, 0, 0, 0, 0],
                ..base
            },
            false,
        ),
        (DepthwiseRow { cols: 0, ..base }, false),
        (DepthwiseRow { rows: 0, ..base }, true),
        (DepthwiseRow { taps: 0, ..base }, true),
    ];
    for (row, zeroes) in cases {
        let footprint_ok = row.footprints().is_some();
        assert_eq!(
            footprint_ok,
            row.cols >= 0 && row.row_stride >= 0 && row.taps <= 8 && row.tap_offsets[1] >= 0,
            "{row}"
        );
        let x = [f32::from_bits(POISON); 200];
        let w = [f32::from_bits(POISON); 20];
        for (name, f) in routines() {
            let mut out = vec![f32::from_bits(POISON); 40];
            // SAFETY: an invalid record is refused whole and a valid empty one reads
            // nothing; `out` holds 20 elements after 10 of guard.
            unsafe { f(x.as_ptr(), w.as_ptr(), out.as_mut_ptr().add(10), &row) };
            for (i, v) in out.iter().enumerate() {
                let in_row = (10..10 + row.cols.max(0) as usize).contains(&i);
                if zeroes && in_row {
                    assert_eq!(v.to_bits(), 0, "{name} {row}: out[{}] not zeroed", i - 10);
                } else {
                    assert_eq!(v.to_bits(), POISON, "{name} {row}: touched out at {i}");
                }
            }
        }
    }
}
