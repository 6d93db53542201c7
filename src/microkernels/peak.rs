//! The f32 FMA peak of the CPU a run is on, measured once per process for each vector
//! width the kernels use, so `smelt bench` reports its GFLOP/s against this machine's
//! peak rather than a constant of another one.
//!
//! The CPU class changes between hosts (Zen 3 runs f32x8 at 2× f32x4; Zen 4 runs
//! AVX-512 on 256-bit units, so f32x16 is no faster than f32x8): neither the lane count
//! nor a feature flag gives the peak, so it is measured. The probe is a loop of
//! independent FMAs — [`ACCUMULATORS`] chains, more than latency × FMA pipes on any
//! current x86 core, so the loop is bound by throughput — timed for about 2 ms, best of
//! [`REPEATS`], a width the CPU lacks reported as absent. All widths together cost
//! ≈ 20 ms, once.

use std::sync::OnceLock;
use std::time::Instant;

/// Independent FMA chains in flight: 4-cycle latency × 2 pipes needs 8; 12 leaves slack.
const ACCUMULATORS: usize = 12;

/// Loop trips of one timed probe: 12 FMAs each, ≈ 2 ms on a 3 GHz core with 2 FMA pipes.
const TRIPS: u64 = 500_000;

/// Timed probes per width; the fastest counts (the others met interrupts or a busy core).
const REPEATS: usize = 3;

/// A measured FMA peak of one core for one vector width.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FmaPeak {
    /// f32 lanes per vector (4, 8 or 16).
    pub lanes: usize,
    /// GFLOP/s of one core (an FMA counts 2 flops per lane).
    pub gflops_per_core: f64,
}

/// The measured peak of one core for vectors of `lanes` f32 (4, 8 or 16), or `None` when
/// the CPU has no FMA of that width (or is not x86-64). Measured on first use, then kept.
pub fn fma_peak(lanes: usize) -> Option<FmaPeak> {
    static PEAKS: [OnceLock<Option<f64>>; 3] = [const { OnceLock::new() }; 3];
    let slot = match lanes {
        4 => 0,
        8 => 1,
        16 => 2,
        _ => return None,
    };
    PEAKS[slot]
        .get_or_init(|| measure(lanes))
        .map(|gflops_per_core| FmaPeak {
            lanes,
            gflops_per_core,
        })
}

/// The best of [`REPEATS`] probes of one width, in GFLOP/s, or `None` without the ISA.
fn measure(lanes: usize) -> Option<f64> {
    let probe = probe_for(lanes)?;
    let flops = (TRIPS * ACCUMULATORS as u64 * lanes as u64 * 2) as f64;
    let best = (0..REPEATS)
        .map(|_| {
            let start = Instant::now();
            probe(std::hint::black_box(TRIPS));
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min);
    (best > 0.0).then(|| flops / best / 1e9)
}

/// Whether the host has FMA on 128-bit vectors (what Cranelift's f32x4 code can use).
fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The probe of a width the host runs.
#[cfg(target_arch = "x86_64")]
fn probe_for(lanes: usize) -> Option<fn(u64)> {
    match lanes {
        // SAFETY: each guard detected the features its probe is compiled for.
        4 if has_fma() => Some(|n| unsafe { x86::fma_x4(n) }),
        // SAFETY: as above (AVX2 and FMA detected).
        8 if super::has_avx2_fma() => Some(|n| unsafe { x86::fma_x8(n) }),
        // SAFETY: as above (AVX-512F detected).
        16 if super::has_avx512f() => Some(|n| unsafe { x86::fma_x16(n) }),
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn probe_for(_lanes: usize) -> Option<fn(u64)> {
    None
}

/// The probes. Safety: each is called only after `probe_for` detected its features.
/// The accumulators converge (`acc·0.5 + 0.5` → 1), so no value overflows or turns
/// denormal, which would slow the loop on some cores; `black_box` keeps the loop from
/// being removed.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::ACCUMULATORS;
    use std::arch::x86_64::*;

    /// One probe: `$name`, compiled for `$features`, runs `trips` rounds of one FMA per
    /// accumulator on the vectors `$splat` makes and `$fma` multiplies and adds.
    macro_rules! fma_probe {
        ($name:ident, $features:literal, $splat:ident, $fma:ident) => {
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name(trips: u64) {
                let half = $splat(0.5);
                let mut acc = [$splat(0.25); ACCUMULATORS];
                for _ in 0..trips {
                    for a in &mut acc {
                        *a = $fma(*a, half, half);
                    }
                }
                std::hint::black_box(acc);
            }
        };
    }

    fma_probe!(fma_x4, "fma", _mm_set1_ps, _mm_fmadd_ps);
    fma_probe!(fma_x8, "avx2,fma", _mm256_set1_ps, _mm256_fmadd_ps);
    fma_probe!(fma_x16, "avx512f", _mm512_set1_ps, _mm512_fmadd_ps);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_width_the_host_runs_is_measured_and_the_others_are_absent() {
        let mut measured = 0;
        for (lanes, runs) in [
            (4, has_fma()),
            (8, super::super::has_avx2_fma()),
            (16, super::super::has_avx512f()),
        ] {
            let peak = fma_peak(lanes);
            assert_eq!(peak.is_some(), runs, "f32x{lanes}: {peak:?}");
            if let Some(p) = peak {
                assert_eq!(p.lanes, lanes);
                assert!(
                    p.gflops_per_core.is_finite() && p.gflops_per_core > 0.0,
                    "f32x{lanes}: {p:?}"
                );
                measured += 1;
            }
        }
        assert_eq!(fma_peak(3), None);
        // A host without FMA measures nothing; say so rather than pass silently.
        if measured == 0 {
            eprintln!("this host has no FMA: no width was measured");
        }
    }
}
