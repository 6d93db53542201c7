//! The native blocked-depthwise-row routines (AVX2; AVX-512 where the host has it) and
//! their scalar reference against the contract computed here: 3×3, 5×5 and 7-wide
//! windows at strides 1, 2 and 3, dilation 2, windows wider than the row, partial blocks
//! of 4, 8 and 12 lanes, with and without a bias, each activation. Every element a routine may not read (guard regions
//! around each buffer, the gaps between kernel rows, a partial block's padded lanes) is
//! a NaN that would reach the results; results must match bit for bit (the same fused
//! multiply-adds in the same order) and guards stay unwritten. Records the contract
//! refuses touch nothing.

mod common;

use smelt::ir::loops::{BlockedDepthwiseRow, StoreActivation};
use smelt::ir::weights::random_f32;
use smelt::microkernels::{self, BlockedDepthwiseRowFn};

/// The NaN every element that must not be read holds.
const POISON: u32 = 0x7fc0_5707;
/// Guard elements before and after every buffer.
const GUARD: usize = 37;
/// Elements per pixel.
const BLOCK: usize = 16;

/// The routines this host runs, the reference first. On x86-64 the AVX2 routine is
/// required (the test machines have it); the AVX-512 one runs where the CPU has
/// AVX-512F (a host without it covers one routine fewer: the count below says so).
fn routines() -> Vec<(&'static str, BlockedDepthwiseRowFn)> {
    let mut v: Vec<(&'static str, BlockedDepthwiseRowFn)> =
        vec![("reference", microkernels::blocked_depthwise_row_reference)];
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            microkernels::has_avx2_fma(),
            "an x86-64 test machine without AVX2 + FMA"
        );
        v.push(("avx2", microkernels::blocked_depthwise_row_avx2));
        if microkernels::has_avx512f() {
            v.push(("avx512", microkernels::blocked_depthwise_row_avx512));
        }
    }
    v
}

fn poison() -> f32 {
    f32::from_bits(POISON)
}

/// `len` elements of runs of 16 lanes from `seed`, poison in every lane at or past
/// `lanes` and in every element `keep` refuses, between guard regions of poison.
fn guarded(len: usize, lanes: usize, seed: u64, keep: impl Fn(usize) -> bool) -> Vec<f32> {
    let values = random_f32(seed, len, -2.0, 2.0);
    let mut v = vec![poison(); GUARD];
    v.extend((0..len).map(|i| {
        if i % BLOCK < lanes && keep(i) {
            values[i]
        } else {
            poison()
        }
    }));
    v.extend(std::iter::repeat_n(poison(), GUARD));
    v
}

fn guards_intact(buf: &[f32]) -> bool {
    let n = buf.len();
    buf[..GUARD]
        .iter()
        .chain(&buf[n - GUARD..])
        .all(|v| v.to_bits() == POISON)
}

/// The contract in this file's own words: `x`, `w` and `bias` without their guards.
fn expected(r: &BlockedDepthwiseRow, x: &[f32], w: &[f32], bias: Option<&[f32]>) -> Vec<u32> {
    let mut out = vec![0f32; r.pixels as usize * BLOCK];
    for p in 0..r.pixels {
        for c in 0..r.lanes {
            let mut acc = bias.map_or(0.0, |b| b[c as usize]);
            for row in 0..r.rows {
                for t in 0..r.taps {
                    let col = p * r.stride + t * r.dil - r.pad;
                    if (0..r.cols).contains(&col) {
                        let xi = row * r.x_row_stride + col * BLOCK as i64 + c;
                        let wi = row * r.w_row_stride + t * BLOCK as i64 + c;
                        acc = x[xi as usize].mul_add(w[wi as usize], acc);
                    }
                }
            }
            let act = r.activation().expect("a valid record");
            out[p as usize * BLOCK + c as usize] = common::store_activation(act, acc);
        }
    }
    out.iter().map(|v| v.to_bits()).collect()
}

/// A window along a row: taps, stride, dilation, padding.
type Window = (i64, i64, i64, i64);

/// A record of a row of `cols` input columns through a `taps`-wide window, its output
/// width the convolution's; kernel rows and weight rows with gaps between them.
fn record(
    lanes: i64,
    cols: i64,
    (taps, stride, dil, pad): Window,
    rows: i64,
) -> BlockedDepthwiseRow {
    let pixels = ((cols + 2 * pad - dil * (taps - 1) - 1) / stride + 1).max(0);
    BlockedDepthwiseRow {
        pixels,
        lanes,
        cols,
        stride,
        dil,
        pad,
        taps,
        rows,
        x_row_stride: cols * BLOCK as i64 + 2 * BLOCK as i64,
        w_row_stride: taps * BLOCK as i64 + BLOCK as i64,
        act: 0,
    }
}

#[test]
fn routines_equal_the_contract_bit_for_bit_and_read_only_their_lanes() {
    // (taps, stride, dil, pad) and the row widths each runs at
    // (stride 3 runs on the routine's run-time stride path; pad 0 has no left border;
    // pad 4 on 3 taps leaves pixels with no valid tap at all)
    let windows: [(Window, &[i64]); 11] = [
        ((3, 1, 1, 1), &[1, 2, 7, 14, 29]),
        ((3, 3, 1, 1), &[7, 10, 20]),
        ((3, 1, 1, 0), &[3, 5, 9]),
        ((2, 2, 1, 0), &[8, 9]),
        ((3, 1, 1, 4), &[1, 3, 12]),
        ((5, 1, 1, 2), &[3, 7, 14, 28]),
        ((5, 2, 1, 2), &[7, 14, 15]),
        ((3, 2, 1, 1), &[2, 15, 56]),
        ((3, 1, 2, 2), &[5, 9]),
        ((7, 1, 1, 3), &[4, 20]),
        ((1, 1, 1, 0), &[6]),
    ];
    let mut calls = 0;
    for (name, f) in routines() {
        for (window, widths) in windows {
            for &cols in widths {
                for lanes in [16, 12, 8, 4] {
                    for rows in [0, 1, 3] {
                        for with_bias in [false, true] {
                            // each call the next activation: every routine sees each on
                            // every window
                            let act = StoreActivation::ALL[calls % StoreActivation::ALL.len()];
                            let r = BlockedDepthwiseRow {
                                act: act.index(),
                                ..record(lanes, cols, window, rows)
                            };
                            let what = format!("{name} {r} bias={with_bias}");
                            let [xs, ws, _, os] = r.footprints().expect("a valid record");
                            let lanes = lanes as usize;
                            // x and w: the gaps between kernel rows are poison too
                            let x_row = r.x_row_stride as usize;
                            let x = guarded(xs as usize, lanes, 1 + cols as u64, |i| {
                                i % x_row < cols as usize * BLOCK
                            });
                            let w_row = r.w_row_stride as usize;
                            let w = guarded(ws as usize, lanes, 2, |i| {
                                i % w_row < r.taps as usize * BLOCK
                            });
                            let bias = guarded(BLOCK, lanes, 3, |_| true);
                            let mut out = vec![7.0f32; os as usize + 2 * GUARD];
                            out[..GUARD].fill(poison());
                            let n = out.len();
                            out[n - GUARD..].fill(poison());
                            let body =
                                |b: &Vec<f32>, len: i64| b[GUARD..GUARD + len as usize].to_vec();
                            let want = expected(
                                &r,
                                &body(&x, xs),
                                &body(&w, ws),
                                with_bias.then(|| body(&bias, BLOCK as i64)).as_deref(),
                            );
                            // SAFETY: every run the contract names is inside its buffer,
                            // past its guard (the footprints size them); the routine runs
                            // on this host.
                            unsafe {
                                f(
                                    x.as_ptr().add(GUARD),
                                    w.as_ptr().add(GUARD),
                                    match with_bias {
                                        true => bias.as_ptr().add(GUARD),
                                        false => std::ptr::null(),
                                    },
                                    out.as_mut_ptr().add(GUARD),
                                    &r,
                                )
                            };
                            let got: Vec<u32> =
                                out[GUARD..n - GUARD].iter().map(|v| v.to_bits()).collect();
                            assert_eq!(got, want, "{what}");
                            assert!(
                                got.iter().all(|&b| b != POISON),
                                "{what}: a poisoned element was read"
                            );
                            assert!(guards_intact(&out), "{what}: a guard was written");
                            calls += 1;
                        }
                    }
                }
            }
        }
    }
    // 31 rows of 4 lane counts × 3 kernel-row counts × 2 biases per routine
    let per_routine = 31 * 4 * 3 * 2;
    assert_eq!(calls % per_routine, 0);
    assert!(calls >= per_routine, "only {calls} calls ran");
    #[cfg(target_arch = "x86_64")]
    assert_eq!(
        calls,
        routines().len() * per_routine,
        "the AVX2 (and, on an AVX-512 host, the AVX-512) routine did not run"
    );
    #[cfg(target_arch = "x86_64")]
    assert!(routines().len() >= 2, "the AVX2 routine did not run");
}

#[test]
fn records_the_contract_refuses_touch_nothing() {
    let valid = record(16, 8, (3, 1, 1, 1), 1);
    let refused = [
        BlockedDepthwiseRow { lanes: 6, ..valid },
        BlockedDepthwiseRow { lanes: 0, ..valid },
        BlockedDepthwiseRow { stride: 0, ..valid },
        BlockedDepthwiseRow { dil: 0, ..valid },
        BlockedDepthwiseRow {
            pixels: -1,
            ..valid
        },
        BlockedDepthwiseRow { pad: -1, ..valid },
        BlockedDepthwiseRow { act: 3, ..valid },
        BlockedDepthwiseRow {
            x_row_stride: -16,
            ..valid
        },
    ];
    for (name, f) in routines() {
        for r in &refused {
            assert!(r.footprints().is_none(), "{r} has footprints");
            let x = vec![1.5f32; 1024];
            let mut out = vec![7.0f32; 1024];
            // SAFETY: a record the contract says touches nothing; the buffers are larger
            // than any run the valid record it was made from names anyway.
            unsafe {
                f(
                    x.as_ptr(),
                    x.as_ptr(),
                    std::ptr::null(),
                    out.as_mut_ptr(),
                    r,
                )
            };
            assert!(out.iter().all(|&v| v == 7.0), "{name}: {r} wrote");
        }
    }
}
