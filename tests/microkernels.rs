//! The native conv-tile micro-kernels (16 and 32 lanes) against the scalar references, over
//! many shapes, with poisoned gaps and guard regions to catch any access outside the
//! contract's index sets.

mod common;

use smelt::ir::loops::StoreActivation;
use smelt::ir::weights::random_f32;
use smelt::microkernels::{self, ConvTile as Call, ConvTileFn, LANES, LANES_X32};

/// The NaN every element outside a contract index set holds (a payload no arithmetic makes).
const POISON: u32 = 0x7fc0_dead;
/// Poisoned elements before and after every buffer.
const GUARD: usize = 67;

/// The index sets of a call's contract, and the call itself.
trait Contract {
    fn x_indices(&self) -> Vec<usize>;
    fn w_indices(&self) -> Vec<usize>;
    fn out_indices(&self) -> Vec<usize>;
    fn run(&self, f: ConvTileFn, x: &[f32], w: &[f32], out: &mut [f32]);
}

impl Contract for Call {
    fn x_indices(&self) -> Vec<usize> {
        let mut v = Vec::new();
        for r in 0..self.rows {
            for t in 0..self.taps {
                for c in 0..self.chans {
                    for p in 0..self.pixels {
                        v.push(
                            (r * self.row_stride
                                + t * self.tap_stride
                                + c * self.chan_stride
                                + p * self.pixel_stride) as usize,
                        );
                    }
                }
            }
        }
        v
    }

    fn w_indices(&self) -> Vec<usize> {
        let mut v = Vec::new();
        for r in 0..self.rows {
            for t in 0..self.taps {
                for c in 0..self.chans {
                    for l in 0..self.lanes {
                        v.push(
                            ((r * self.taps + t) * self.w_tap_stride + c * self.lanes + l) as usize,
                        );
                    }
                }
            }
        }
        v
    }

    fn out_indices(&self) -> Vec<usize> {
        let mut v = Vec::new();
        for p in 0..self.pixels {
            for l in 0..self.lanes {
                v.push(
                    (p * self.out_pixel_stride
                        + (l / 16) * self.out_block_stride
                        + (l % 16 / 4) * self.out_vec_stride
                        + l % 4) as usize,
                );
            }
        }
        v
    }

    /// Calls `f` with the buffers' interiors (past the front guard); the run to prefetch
    /// is `w`'s interior.
    fn run(&self, f: ConvTileFn, x: &[f32], w: &[f32], out: &mut [f32]) {
        // SAFETY: the buffers hold every index of the contract (built from the index sets
        // plus guards) and do not overlap; `next_len` is at most w's interior (`check`);
        // the caller checked the ISA.
        unsafe {
            f(
                x.as_ptr().add(GUARD),
                w.as_ptr().add(GUARD),
                out.as_mut_ptr().add(GUARD),
                self,
                w.as_ptr().add(GUARD),
                std::ptr::null(),
                std::ptr::null(),
            )
        }
    }
}

/// A buffer of poison with `GUARD` elements on each side, random values at `indices`.
fn poisoned(indices: &[usize], seed: u64) -> Vec<f32> {
    let len = indices.iter().max().map_or(0, |m| m + 1);
    let mut buf = vec![f32::from_bits(POISON); len + 2 * GUARD];
    let values = random_f32(seed, indices.len(), -1.0, 1.0);
    for (&i, v) in indices.iter().zip(values) {
        buf[GUARD + i] = v;
    }
    buf
}

/// The kernels of `lanes` lanes this host can run, by name; on x86-64 AVX2+FMA is required.
fn kernels(lanes: i64) -> Vec<(&'static str, ConvTileFn)> {
    #[cfg(target_arch = "x86_64")]
    {
        assert!(
            microkernels::has_avx2_fma(),
            "this x86-64 host lacks AVX2+FMA: the micro-kernels cannot be tested"
        );
        assert_eq!(
            microkernels::has_avx512f(),
            std::is_x86_feature_detected!("avx512f")
        );
        let avx512 = microkernels::has_avx512f();
        let mut v: Vec<(&'static str, ConvTileFn)> = Vec::new();
        match lanes as usize {
            LANES => {
                v.push(("avx2", microkernels::conv_tile_avx2));
                if avx512 {
                    v.push(("avx512", microkernels::conv_tile_avx512));
                }
            }
            LANES_X32 => {
                if avx512 {
                    v.push(("avx512_x32", microkernels::conv_tile_avx512_x32));
                }
            }
            _ => panic!("no kernel has {lanes} lanes"),
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        assert!(!microkernels::has_avx2_fma() && !microkernels::has_avx512f());
        let _ = lanes;
        Vec::new()
    }
}

/// Both lane counts.
const ALL_LANES: [i64; 2] = [LANES as i64, LANES_X32 as i64];

/// Every native kernel this build has on x86-64, by the names [`kernels`] gives them.
const ALL_KERNELS: [&str; 3] = ["avx2", "avx512", "avx512_x32"];

/// The kernels a test ran, so that a host without an ISA says what it did not cover
/// (printed when the test ends) and a test that ran no native kernel fails instead of
/// passing on empty loops.
#[derive(Default)]
struct Coverage {
    calls: std::collections::BTreeMap<&'static str, usize>,
}

impl Coverage {
    /// [`kernels`] of `lanes` lanes, counted.
    fn kernels(&mut self, lanes: i64) -> Vec<(&'static str, ConvTileFn)> {
        let v = kernels(lanes);
        for (name, _) in &v {
            *self.calls.entry(name).or_default() += 1;
        }
        v
    }

    /// Reports what ran and what this host lacks; fails when no native kernel ran. Off
    /// x86-64 no native kernel exists, and the report says so.
    fn finish(self, test: &str) {
        let ran: Vec<String> = self
            .calls
            .iter()
            .map(|(k, n)| format!("{k} ({n} calls)"))
            .collect();
        let missing: Vec<&str> = ALL_KERNELS
            .into_iter()
            .filter(|k| !self.calls.contains_key(k))
            .collect();
        eprintln!(
            "{test}: ran {}; not run on this host: {}",
            if ran.is_empty() {
                "no native kernel".into()
            } else {
                ran.join(", ")
            },
            if missing.is_empty() {
                "none".into()
            } else {
                missing.join(", ")
            }
        );
        if cfg!(target_arch = "x86_64") {
            assert!(!self.calls.is_empty(), "{test}: no native kernel ran");
        }
    }
}

/// Runs `call` through the reference and every kernel; checks results, untouched poison
/// outside the out index set, and bit-identical repeats.
fn check(call: &Call, seed: u64, cov: &mut Coverage) {
    let x = poisoned(&call.x_indices(), seed);
    let w = poisoned(&call.w_indices(), seed ^ 0x5555);
    let out_idx = call.out_indices();
    let mut init = poisoned(&out_idx, seed ^ 0xaaaa);
    if !call.accumulate {
        // a non-accumulating kernel must not read out: poison its initial values too
        for &i in &out_idx {
            init[GUARD + i] = f32::from_bits(POISON);
        }
    }
    let mut want = init.clone();
    call.run(microkernels::conv_tile_reference, &x, &w, &mut want);
    let in_set: std::collections::HashSet<usize> = out_idx.iter().map(|i| i + GUARD).collect();
    let scale = out_idx
        .iter()
        .map(|&i| f64::from(want[GUARD + i]).abs())
        .fold(1.0, f64::max);
    for (name, f) in cov.kernels(call.lanes) {
        let mut got = init.clone();
        call.run(f, &x, &w, &mut got);
        let mut max_err = 0.0f64;
        for (i, (&g, &r)) in got.iter().zip(&want).enumerate() {
            if in_set.contains(&i) {
                assert!(
                    g.is_finite(),
                    "{name} {call:?}: out[{i}] = {g} (read poison?)"
                );
                max_err = max_err.max((f64::from(g) - f64::from(r)).abs());
            } else {
                assert_eq!(
                    g.to_bits(),
                    POISON,
                    "{name} {call:?}: wrote out[{}] outside the index set",
                    i as isize - GUARD as isize
                );
            }
        }
        assert!(
            max_err / scale <= 1e-5,
            "{name} {call:?}: relative error {}",
            max_err / scale
        );
        let mut again = init.clone();
        call.run(f, &x, &w, &mut again);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(&got),
            bits(&again),
            "{name} {call:?}: not deterministic"
        );
        // prefetching a run (here all of w) changes nothing
        let prefetching = Call {
            next_len: (w.len() - 2 * GUARD) as i64,
            ..*call
        };
        let mut with_next = init.clone();
        prefetching.run(f, &x, &w, &mut with_next);
        assert_eq!(
            bits(&got),
            bits(&with_next),
            "{name} {call:?}: prefetching the next run changed the result"
        );
    }
}

/// Input layouts: `(chan_stride, pixel_stride, tap_stride, row_stride)` for a tile of
/// `pixels` outputs with `taps` kernel columns and `chans` input channels.
fn x_layouts(pixels: i64, taps: i64, chans: i64) -> Vec<(i64, i64, i64, i64)> {
    let c = chans;
    let mut v = Vec::new();
    for stride in [1, 2] {
        // channels-last padded rows: pixel stride C or 2C, next tap one pixel over
        let wpad = pixels * stride + taps + 1;
        v.push((1, c * stride, c, wpad * c));
        // planar (NCHW): channel = plane apart, pixels 1 or 2 apart in a row
        let plane = wpad * 4 + 3;
        v.push((plane, stride, 1, wpad));
    }
    // overlapping channels-last windows with pixel stride 1 (odd but legal)
    v.push((1, 1, 3, 7 + pixels));
    // channel blocks of 16 (NCHW16c; rows walk the blocks): a pixel's 16 channels are
    // consecutive, blocks a padded plane apart
    v.push((1, 16, 16, 16 * (pixels + taps + 2)));
    v
}

#[test]
fn kernels_match_reference_on_many_shapes() {
    let mut cov = Coverage::default();
    let mut seed = 1;
    let mut cases = 0;
    for (lanes, pixels) in ALL_LANES
        .into_iter()
        .flat_map(|l| [0, 1, 2, 5, 6, 7, 12, 13, 14, 15, 28, 56, 112].map(|p| (l, p)))
    {
        for (rows, taps) in [(1, 1), (3, 3), (1, 3)] {
            for chans in [1, 3, 16, 64] {
                for (chan_stride, pixel_stride, tap_stride, row_stride) in
                    x_layouts(pixels, taps, chans)
                {
                    // [p][lanes]; the partial-sum layout; with 32 lanes, two blocks of a
                    // channel-blocked result, a block (and a gap) apart
                    let layouts = [
                        (lanes, 4, 16),
                        (4, 4 * pixels + 5, 4 * (4 * pixels + 5)),
                        (16, 4, 16 * pixels + 7),
                    ];
                    let used = if lanes > 16 { 3 } else { 2 };
                    for &(out_pixel_stride, out_vec_stride, out_block_stride) in &layouts[..used] {
                        for accumulate in [false, true] {
                            // packed weights, or a gap (poisoned) between taps
                            let w_tap_stride = chans * lanes + if seed % 3 == 0 { 32 } else { 0 };
                            let call = Call {
                                lanes,
                                pixels,
                                rows,
                                row_stride,
                                taps,
                                tap_stride,
                                chans,
                                chan_stride,
                                pixel_stride,
                                w_tap_stride,
                                out_pixel_stride,
                                out_vec_stride,
                                out_block_stride,
                                next_len: 0,
                                finish: 0,
                                accumulate,
                            };
                            check(&call, seed, &mut cov);
                            seed += 1;
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    // 16 lanes in two out layouts, 32 lanes in three
    assert_eq!(cases, 13 * 3 * 4 * 6 * 2 * (2 + 3));
    cov.finish("kernels_match_reference_on_many_shapes");
}

/// The store routines' finish of one sum (their contract): the bias, the residual, the
/// activation, each operation as they round it.
fn store_finish(act: StoreActivation, v: f32, bias: Option<f32>, residual: Option<f32>) -> f32 {
    let v = bias.map_or(v, |b| v + b);
    let v = residual.map_or(v, |r| v + r);
    common::store_activation(act, v)
}

/// A tile that finishes its sums (bias, residual, activation in registers) stores, bit
/// for bit, what the same tile without a finish followed by the store routine's formula
/// gives, for every kernel and the reference; it reads its bias only at the lanes and
/// its residual only at the out indices (both poisoned elsewhere), and writes nothing
/// else. Accumulating tiles finish the accumulated sum; an empty reduction finishes its
/// initial value.
#[test]
fn finished_tiles_store_what_the_store_routines_would() {
    let mut cov = Coverage::default();
    let mut cases = 0;
    for lanes in ALL_LANES {
        for (chans, pixels) in [(16, 56), (3, 13), (0, 5)] {
            // [p][lanes]; with 32 lanes, two blocks of a channel-blocked result
            let layouts: &[(i64, i64)] = if lanes > 16 {
                &[(lanes, 16), (16, 16 * pixels + 7)]
            } else {
                &[(16, 16)]
            };
            for &(out_pixel_stride, out_block_stride) in layouts {
                for act in StoreActivation::ALL {
                    for (with_bias, with_residual, accumulate) in [
                        (true, false, false),
                        (false, true, false),
                        (true, true, false),
                        (true, true, true),
                        (false, false, false),
                    ] {
                        let plain = Call {
                            lanes,
                            pixels,
                            rows: 1,
                            row_stride: 0,
                            taps: 1,
                            tap_stride: 0,
                            chans,
                            chan_stride: 1,
                            pixel_stride: 16,
                            w_tap_stride: chans * lanes,
                            out_pixel_stride,
                            out_vec_stride: 4,
                            out_block_stride,
                            next_len: 0,
                            finish: 0,
                            accumulate,
                        };
                        let call = Call {
                            finish: Call::finish_code(act),
                            ..plain
                        };
                        let seed = 100 + cases as u64;
                        let x = poisoned(&call.x_indices(), seed);
                        let w = poisoned(&call.w_indices(), seed ^ 0x5555);
                        let out_idx = call.out_indices();
                        let mut init = poisoned(&out_idx, seed ^ 0xaaaa);
                        if !accumulate {
                            for &i in &out_idx {
                                init[GUARD + i] = f32::from_bits(POISON);
                            }
                        }
                        // sums around zero, so the activations' both sides are taken
                        let bias = poisoned(&(0..lanes as usize).collect::<Vec<_>>(), seed ^ 7);
                        let residual = poisoned(&out_idx, seed ^ 9);
                        let (b, r) = (
                            with_bias.then(|| bias.as_ptr().wrapping_add(GUARD)),
                            with_residual.then(|| residual.as_ptr().wrapping_add(GUARD)),
                        );
                        let run = |f: ConvTileFn, c: &Call, out: &mut Vec<f32>| {
                            // SAFETY: the buffers hold every index of the contract (built
                            // from its index sets plus guards); the bias holds `lanes`
                            // elements and the residual the out indices; no overlap.
                            unsafe {
                                f(
                                    x.as_ptr().add(GUARD),
                                    w.as_ptr().add(GUARD),
                                    out.as_mut_ptr().add(GUARD),
                                    c,
                                    std::ptr::null(),
                                    b.unwrap_or(std::ptr::null()),
                                    r.unwrap_or(std::ptr::null()),
                                )
                            }
                        };
                        let in_set: std::collections::HashSet<usize> =
                            out_idx.iter().map(|i| i + GUARD).collect();
                        let kernels = cov.kernels(lanes).into_iter().chain([(
                            "reference",
                            microkernels::conv_tile_reference as ConvTileFn,
                        )]);
                        for (name, f) in kernels {
                            let mut want = init.clone();
                            run(f, &plain, &mut want);
                            for p in 0..pixels {
                                for l in 0..lanes {
                                    let o = (p * out_pixel_stride
                                        + (l / 16) * out_block_stride
                                        + (l % 16 / 4) * 4
                                        + l % 4)
                                        as usize;
                                    want[GUARD + o] = store_finish(
                                        act,
                                        want[GUARD + o],
                                        with_bias.then(|| bias[GUARD + l as usize]),
                                        with_residual.then(|| residual[GUARD + o]),
                                    );
                                }
                            }
                            let mut got = init.clone();
                            run(f, &call, &mut got);
                            for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                                if in_set.contains(&i) {
                                    assert_eq!(
                                        g.to_bits(),
                                        w.to_bits(),
                                        "{name} {call:?} bias={with_bias} residual={with_residual}: out[{}]",
                                        i - GUARD
                                    );
                                    assert!(g.is_finite(), "{name} {call:?}: read poison");
                                } else {
                                    assert_eq!(
                                        g.to_bits(),
                                        POISON,
                                        "{name} {call:?}: wrote out[{i}]"
                                    );
                                }
                            }
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 0);
    cov.finish("finished_tiles_store_what_the_store_routines_would");
}

#[test]
fn typical_calls_match_reference() {
    let mut cov = Coverage::default();
    // a 3×3 channels-last row at 128 channels, 28 pixels; stride 2; a 1×1 NCHW row
    for lanes in ALL_LANES {
        let base = Call {
            lanes,
            pixels: 28,
            rows: 3,
            row_stride: 30 * 128,
            taps: 3,
            tap_stride: 128,
            chans: 128,
            chan_stride: 1,
            pixel_stride: 128,
            w_tap_stride: 128 * lanes,
            out_pixel_stride: lanes,
            out_vec_stride: 4,
            out_block_stride: 16,
            next_len: 0,
            finish: 0,
            accumulate: false,
        };
        check(&base, 7 + lanes as u64, &mut cov);
        check(
            &Call {
                pixels: 14,
                row_stride: 30 * 128,
                pixel_stride: 256,
                accumulate: true,
                ..base
            },
            8 + lanes as u64,
            &mut cov,
        );
        check(
            &Call {
                pixels: 56,
                rows: 1,
                row_stride: 0,
                taps: 1,
                tap_stride: 0,
                chans: 256,
                chan_stride: 56 * 56,
                pixel_stride: 1,
                w_tap_stride: 256 * lanes,
                out_pixel_stride: 4,
                out_vec_stride: 56 * 4,
                out_block_stride: 4 * 56 * 4,
                next_len: 0,
                finish: 0,
                accumulate: true,
                ..base
            },
            9 + lanes as u64,
            &mut cov,
        );
    }
    cov.finish("typical_calls_match_reference");
}

#[test]
fn every_pixel_stride_path_matches_reference() {
    // the kernels specialize full blocks on these pixel strides (and prefetch planar
    // inputs with strides 1 and 2; 384 to 3072 are GEMM rows of the transformers' K);
    // 7 and 130 take the run-time-stride path; the pixel
    // counts give full blocks and remainders of every kernel's block size
    let mut cov = Coverage::default();
    let mut seed = 100;
    for lanes in ALL_LANES {
        for pixel_stride in [
            1, 2, 3, 6, 7, 64, 128, 130, 256, 384, 512, 768, 1024, 1536, 3072,
        ] {
            for chan_stride in [1, 40 * 1024] {
                for pixels in [63, 28, 14, 13, 6] {
                    let call = Call {
                        lanes,
                        pixels,
                        rows: 1,
                        row_stride: 0,
                        taps: 2,
                        tap_stride: 5,
                        chans: 20,
                        chan_stride,
                        pixel_stride,
                        w_tap_stride: 20 * lanes,
                        out_pixel_stride: lanes,
                        out_vec_stride: 4,
                        out_block_stride: 16,
                        next_len: 0,
                        finish: 0,
                        accumulate: seed % 2 == 0,
                    };
                    check(&call, seed, &mut cov);
                    seed += 1;
                }
            }
        }
    }
    cov.finish("every_pixel_stride_path_matches_reference");
}

#[test]
fn empty_reductions_give_the_initial_value_and_read_nothing() {
    let mut cov = Coverage::default();
    for lanes in ALL_LANES {
        let len = 9 * lanes as usize;
        for (rows, taps, chans) in [(0, 3, 8), (3, 0, 8), (3, 3, 0), (0, 0, 0)] {
            for accumulate in [false, true] {
                let call = Call {
                    lanes,
                    pixels: 9,
                    rows,
                    row_stride: 100,
                    taps,
                    tap_stride: 10,
                    chans,
                    chan_stride: 1,
                    pixel_stride: 10,
                    w_tap_stride: 128,
                    out_pixel_stride: lanes,
                    out_vec_stride: 4,
                    out_block_stride: 16,
                    next_len: 0,
                    finish: 0,
                    accumulate,
                };
                let init = random_f32(3, len, -1.0, 1.0);
                for (name, f) in cov
                    .kernels(lanes)
                    .into_iter()
                    .chain([("reference", microkernels::conv_tile_reference as ConvTileFn)])
                {
                    let mut out = init.clone();
                    // SAFETY: x and w have empty index sets, so null is never read; out
                    // holds 9 pixels × `lanes` lanes.
                    unsafe {
                        f(
                            std::ptr::null(),
                            std::ptr::null(),
                            out.as_mut_ptr(),
                            &call,
                            std::ptr::null(),
                            std::ptr::null(),
                            std::ptr::null(),
                        )
                    };
                    let want = if accumulate {
                        init.clone()
                    } else {
                        vec![0.0; len]
                    };
                    assert_eq!(out, want, "{name} {call:?}");
                }
            }
        }
    }
    cov.finish("empty_reductions_give_the_initial_value_and_read_nothing");
}

#[test]
fn zero_pixels_touch_nothing() {
    let mut cov = Coverage::default();
    for lanes in ALL_LANES {
        let call = Call {
            lanes,
            pixels: 0,
            rows: 3,
            row_stride: 1,
            taps: 3,
            tap_stride: 1,
            chans: 64,
            chan_stride: 1,
            pixel_stride: 64,
            w_tap_stride: 1024,
            out_pixel_stride: lanes,
            out_vec_stride: 4,
            out_block_stride: 16,
            next_len: 0,
            finish: 0,
            accumulate: true,
        };
        for (_, f) in cov.kernels(lanes) {
            // SAFETY: no pixels, so every index set is empty and null is never
            // dereferenced; `call` is readable.
            unsafe {
                f(
                    std::ptr::null(),
                    std::ptr::null(),
                    std::ptr::null_mut(),
                    &call,
                    std::ptr::null(),
                    std::ptr::null(),
                    std::ptr::null(),
                )
            };
        }
    }
    cov.finish("zero_pixels_touch_nothing");
}

#[test]
fn entries_are_the_kernels_the_host_can_run() {
    use smelt::microkernels::{TileIsa, ROUTINES};
    assert_eq!(TileIsa::Avx2.host_has(), microkernels::has_avx2_fma());
    assert_eq!(TileIsa::Avx512.host_has(), microkernels::has_avx512f());
    // every ISA offers lowering its routines, widest first, and finds each by its lanes
    for isa in TileIsa::ALL {
        let target = isa.target();
        let lanes: Vec<i64> = target.routines().map(|r| r.lanes).collect();
        assert!(
            !lanes.is_empty() && lanes.windows(2).all(|w| w[0] > w[1]),
            "{isa:?}: {lanes:?}"
        );
        for l in lanes {
            let (i, r) = isa.routine(l).expect("a routine of its own lanes");
            assert_eq!((ROUTINES[i].isa, r.tile.lanes), (isa, l));
        }
    }
    assert_eq!(
        TileIsa::Avx2.target().routine_for(32).map(|r| r.lanes),
        Some(16)
    );
    assert_eq!(
        TileIsa::Avx512.target().routine_for(64).map(|r| r.lanes),
        Some(32)
    );
    assert_eq!(
        TileIsa::Avx512.target().routine_for(48).map(|r| r.lanes),
        Some(16)
    );
    assert_eq!(TileIsa::Avx512.target().routine_for(40), None);
    #[cfg(target_arch = "x86_64")]
    {
        let entries: [ConvTileFn; 3] = [
            microkernels::conv_tile_avx2,
            microkernels::conv_tile_avx512,
            microkernels::conv_tile_avx512_x32,
        ];
        for (r, f) in ROUTINES.iter().zip(entries) {
            assert_eq!(r.entry(), f as *const u8, "{}", r.symbol);
        }
    }
}

/// Speed probe (no assertions; run by hand): one conv layer's calls without the JIT
/// epilogue. `SMELT_PROBE` = `lanes,pixels,useful_pixels,rows,row_stride,chans,
/// chan_stride,pixel_stride,out_rows,x_row_step,blocks`: `blocks` output-channel blocks
/// outermost (weights of one block packed, `rows·chans·lanes` floats), `out_rows` calls
/// per block, each `x_row_step` further in x. Prints GFLOP/s counting `useful_pixels` per
/// call. `SMELT_PROBE_COPIES=N` cycles through N copies of the weights (cold, as in a
/// network); `SMELT_PROBE_NEXT=1` has each call prefetch its share of the next block, as
/// the conv lowering does. E.g. ResNet's last 3×3 convs:
/// `SMELT_PROBE=32,7,7,3,4608,1536,1,512,7,4608,16`.
#[test]
#[ignore = "a speed probe for the micro-kernels, run by hand with SMELT_PROBE"]
fn routine_speed_probe() {
    let spec = std::env::var("SMELT_PROBE").expect("set SMELT_PROBE");
    let v: Vec<i64> = spec
        .split(',')
        .map(|s| s.parse().expect("a number"))
        .collect();
    let [lanes, pixels, useful, rows, row_stride, chans, chan_stride, pixel_stride, out_rows, x_row_step, blocks] =
        v[..]
    else {
        panic!("SMELT_PROBE needs 11 numbers")
    };
    let f = kernels(lanes).pop().expect("a kernel").1;
    // SMELT_PROBE_QUADS=1: sums stored by quads of channels (Winograd's `M`)
    let quads = std::env::var("SMELT_PROBE_QUADS").is_ok_and(|v| v == "1");
    let call = Call {
        lanes,
        pixels,
        rows,
        row_stride,
        taps: 1,
        tap_stride: 0,
        chans,
        chan_stride,
        pixel_stride,
        w_tap_stride: chans * lanes,
        out_pixel_stride: if quads { 4 } else { lanes },
        out_vec_stride: if quads { 4 * pixels } else { 4 },
        out_block_stride: if quads { 16 * pixels } else { 16 },
        next_len: 0,
        finish: 0,
        accumulate: false,
    };
    let x_len = (out_rows - 1) * x_row_step
        + (rows - 1) * row_stride
        + (chans - 1) * chan_stride
        + 1
        + (pixels - 1) * pixel_stride;
    let x = random_f32(1, x_len as usize, -1.0, 1.0);
    let w_block = (rows * chans * lanes) as usize;
    // SMELT_PROBE_COPIES weight copies used in turn: cold weights, as in a whole network
    let copies: usize =
        std::env::var("SMELT_PROBE_COPIES").map_or(1, |c| c.parse().expect("a count"));
    let layer_w = w_block * blocks as usize;
    let w = random_f32(2, layer_w * copies, -1.0, 1.0);
    let mut out = vec![0f32; (pixels * lanes) as usize];
    // SMELT_PROBE_NEXT=1: each call prefetches its share of the next block's weights
    let next = std::env::var("SMELT_PROBE_NEXT").is_ok_and(|v| v == "1");
    let mut turn = 0;
    let mut layer = || {
        turn = (turn + 1) % copies;
        let w = &w[turn * layer_w..];
        for b in 0..blocks as usize {
            for i in 0..out_rows {
                // this call's share of the next block (of the first, after the last)
                let chunk = w_block.div_ceil(out_rows as usize);
                let from = ((b + 1) % blocks as usize) * w_block + i as usize * chunk;
                let len = chunk.min(w.len() - from);
                let call = Call {
                    next_len: if next { len as i64 } else { 0 },
                    ..call
                };
                // SAFETY: every index of the call lies inside the buffers built above.
                unsafe {
                    f(
                        x.as_ptr().add((i * x_row_step) as usize),
                        w.as_ptr().add(b * w_block),
                        out.as_mut_ptr(),
                        &call,
                        w.as_ptr().add(from),
                        std::ptr::null(),
                        std::ptr::null(),
                    )
                }
            }
        }
    };
    let mut best = f64::MAX;
    for _ in 0..50 {
        let t = std::time::Instant::now();
        for _ in 0..10 {
            layer();
        }
        best = best.min(t.elapsed().as_secs_f64() / 10.0);
    }
    let flops = 2.0 * (blocks * out_rows * useful * lanes * rows * chans) as f64;
    println!(
        "{spec}: {:.3} ms, {:.1} GFLOP/s",
        best * 1e3,
        flops / best / 1e9
    );
}

/// Each row routine sits at its `RowRoutine::index` in `ROW_ROUTINES` (code generation
/// names it by that index), every kind has one per ISA, and on x86-64 each has an entry.
#[test]
fn row_routines_are_where_their_index_says() {
    use smelt::microkernels::{RowRoutine, TileIsa, ROW_ROUTINES};
    for kind in RowRoutine::ALL {
        for isa in TileIsa::ALL {
            let (k, i, symbol) = ROW_ROUTINES[kind.index(isa)];
            assert_eq!((k, i), (kind, isa), "{symbol}");
            assert_eq!(
                kind.entry(isa).is_null(),
                !cfg!(target_arch = "x86_64"),
                "{symbol}"
            );
        }
    }
    assert_eq!(
        ROW_ROUTINES.len(),
        RowRoutine::ALL.len() * TileIsa::ALL.len()
    );
}
