//! The transcendental functions the JIT expands into instruction sequences (Cranelift has
//! none): `log`, `exp`, `sin`, `cos` and `atan` on f32 lanes, with the special values IEEE
//! gives them.

use super::*;

impl Gen<'_, '_> {
    /// ln x: x = m · 2^e with m in [√½, √2), ln(m) by the Cephes degree-9 polynomial in
    /// m − 1, plus e · ln 2 (split for precision). Subnormal inputs are scaled by 2^25
    /// first; x < 0 and NaN give NaN, 0 gives -inf, +inf gives +inf. Relative error ≈ 1e-7.
    pub(super) fn log(&mut self, input: ClifValue) -> ClifValue {
        let ty = self.fb.func.dfg.value_type(input);
        let (ity, vector) = if ty.is_vector() {
            (types::I32X4, true)
        } else {
            (types::I32, false)
        };
        let flags = MemFlagsData::new().with_endianness(Endianness::Little);
        let int = |g: &mut Self, v: i64| {
            let c = g.fb.ins().iconst(types::I32, v);
            if vector {
                g.fb.ins().splat(ity, c)
            } else {
                c
            }
        };
        // subnormals: scale into the normal range, remember the 25 in the exponent
        let tiny = self.constant(f32::MIN_POSITIVE, ty);
        let big = self.constant(33_554_432.0, ty);
        let scaled = self.fb.ins().fmul(input, big);
        let x = self.select(FloatCC::LessThan, input, tiny, scaled, input);
        let zero_e = self.constant(0.0, ty);
        let minus25 = self.constant(-25.0, ty);
        let e_adjust = self.select(FloatCC::LessThan, input, tiny, minus25, zero_e);
        let bits = self.fb.ins().bitcast(ity, flags, x);
        // e = (bits >> 23) − 126, m = bits' mantissa with the exponent of 0.5: m in [0.5, 1)
        let shifted = self.fb.ins().ushr_imm_u(bits, 23);
        let bias = int(self, 126);
        let e_int = self.fb.ins().isub(shifted, bias);
        let mantissa_mask = int(self, 0x007f_ffff);
        let half_bits = int(self, 0x3f00_0000);
        let m_bits = self.fb.ins().band(bits, mantissa_mask);
        let m_bits = self.fb.ins().bor(m_bits, half_bits);
        let m = self.fb.ins().bitcast(ty, flags, m_bits);
        let e = self.fb.ins().fcvt_from_sint(ty, e_int);
        let e = self.fb.ins().fadd(e, e_adjust);
        // m < √½: use 2m − 1 and e − 1, else m − 1
        let sqrt_half = self.constant(std::f32::consts::FRAC_1_SQRT_2, ty);
        let one = self.constant(1.0, ty);
        let m2 = self.fb.ins().fadd(m, m);
        let low = self.fb.ins().fsub(m2, one);
        let high = self.fb.ins().fsub(m, one);
        let r = self.select(FloatCC::LessThan, m, sqrt_half, low, high);
        let e_low = self.fb.ins().fsub(e, one);
        let e = self.select(FloatCC::LessThan, m, sqrt_half, e_low, e);
        let coeffs = [
            7.037_683_6e-2,
            -1.151_461e-1,
            1.167_699_9e-1,
            -1.242_014_1e-1,
            1.424_932_3e-1,
            -1.666_805_8e-1,
            2.000_071_5e-1,
            -2.499_999_4e-1,
            3.333_333e-1,
        ];
        let p = self.polynomial(&coeffs, r);
        let z = self.fb.ins().fmul(r, r);
        let rz = self.fb.ins().fmul(r, z);
        let y = self.fb.ins().fmul(p, rz);
        let c1 = self.constant(-2.121_944_4e-4, ty);
        let y = self.fma(e, c1, y);
        let minus_half = self.constant(-0.5, ty);
        let y = self.fma(z, minus_half, y);
        let sum = self.fb.ins().fadd(r, y);
        let ln2_hi = self.constant(0.693_359_4, ty);
        let result = self.fma(e, ln2_hi, sum);
        // the special values: x < 0 or NaN → NaN, 0 → -inf, +inf → +inf
        let nan = self.constant(f32::NAN, ty);
        let neg_inf = self.constant(f32::NEG_INFINITY, ty);
        let inf = self.constant(f32::INFINITY, ty);
        let zero = self.constant(0.0, ty);
        let result = self.select(FloatCC::Equal, input, inf, inf, result);
        let result = self.select(FloatCC::Equal, input, zero, neg_inf, result);
        let result = self.select(FloatCC::LessThan, input, zero, nan, result);
        self.select(FloatCC::Unordered, input, input, input, result)
    }

    /// e^x: clamp to the normal range, x = n·ln2 + r (Cody–Waite split of ln2), e^r by the
    /// Cephes degree-6 polynomial, 2^n built in the exponent bits. Relative error ≈ 2e-7.
    pub(super) fn exp(&mut self, x: ClifValue) -> ClifValue {
        // the constants the native routines share (`microkernels::exp`)
        use crate::microkernels::exp::{HIGHEST, LN2_HI, LN2_LO, LOWEST, MAGIC, POLY};
        let ty = self.fb.func.dfg.value_type(x);
        let (ity, vector) = if ty.is_vector() {
            (types::I32X4, true)
        } else {
            (types::I32, false)
        };
        let lo = self.constant(LOWEST, ty);
        let hi = self.constant(HIGHEST, ty);
        let input = x;
        let x = self.binary(BinOp::Max, x, lo);
        let x = self.binary(BinOp::Min, x, hi);
        // t = x·log2(e) + 1.5·2^23 rounds n = round(x·log2 e) into t's low mantissa bits.
        let magic = self.constant(MAGIC, ty);
        let log2e = self.constant(std::f32::consts::LOG2_E, ty);
        let t = self.fma(x, log2e, magic);
        let n = self.fb.ins().fsub(t, magic);
        let c1 = self.constant(LN2_HI, ty);
        let c2 = self.constant(LN2_LO, ty);
        let r = self.fma(n, c1, x);
        let r = self.fma(n, c2, r);
        let p = self.polynomial(&POLY, r);
        let r2 = self.fb.ins().fmul(r, r);
        let one = self.constant(1.0, ty);
        let r1 = self.fb.ins().fadd(r, one);
        let y = self.fma(p, r2, r1);
        // 2^n: (bits(t) − bits(magic) + 127) << 23
        let flags = MemFlagsData::new().with_endianness(Endianness::Little);
        let tbits = self.fb.ins().bitcast(ity, flags, t);
        let bias = self.fb.ins().iconst(types::I32, 127 - 0x4B40_0000_i64);
        let bias = if vector {
            self.fb.ins().splat(ity, bias)
        } else {
            bias
        };
        let e = self.fb.ins().iadd(tbits, bias);
        let e = self.fb.ins().ishl_imm_u(e, 23);
        let scale = self.fb.ins().bitcast(ty, flags, e);
        let y = self.fb.ins().fmul(y, scale);
        // Past ln(f32::MAX) e^x overflows to +inf, as the interpreter's does (so that
        // sigmoid(-inf) is exactly 0 and silu(-inf) = -inf·0 is NaN, not -inf).
        let overflow = self.constant(88.722_84, ty);
        let inf = self.constant(f32::INFINITY, ty);
        self.select(FloatCC::GreaterThan, input, overflow, inf, y)
    }
}

/// π/2 in three parts for Cody–Waite range reduction: `P1 + P2 + P3` is π/2 within
/// 1.1e-23, each part an f32 (`P1` the nearest f32 to π/2, then the nearest to each rest).
const HALF_PI_PARTS: [f32; 3] = [
    f32::from_bits(0x3fc9_0fdb),
    f32::from_bits(0xb33b_bd2e),
    f32::from_bits(0xa6f7_2ced),
];

/// `r + r³ (−1/3! + r² (1/5! + r² (−1/7! + r² / 9!)))`: sin on [−π/4, π/4], the Taylor
/// polynomial (its remainder r¹¹/11! is below 2e-9 relative there).
const SIN_TAYLOR: [f32; 4] = [1.0 / 362_880.0, -1.0 / 5040.0, 1.0 / 120.0, -1.0 / 6.0];

/// `1 + r² (−1/2 + r² (1/4! + …  + r² (−1/10!)))`: cos on [−π/4, π/4] (remainder below
/// 2e-10).
const COS_TAYLOR: [f32; 5] = [
    -1.0 / 3_628_800.0,
    1.0 / 40_320.0,
    -1.0 / 720.0,
    1.0 / 24.0,
    -0.5,
];

/// atan t = t + t·s·P(s), s = t², on |t| ≤ tan(π/8): P fitted by weighted least squares
/// iterated towards minimax (Lawson) on Chebyshev nodes; error below 7e-10 relative.
const ATAN_FIT: [f32; 5] = [
    -0.060_834_378,
    0.105_959_95,
    -0.142_438_47,
    0.199_984_9,
    -0.333_333_16,
];

impl Gen<'_, '_> {
    /// Horner's rule: `coeffs[0] z^(k−1) + … + coeffs[k−1]`.
    fn polynomial(&mut self, coeffs: &[f32], z: ClifValue) -> ClifValue {
        let ty = self.fb.func.dfg.value_type(z);
        let mut p = self.constant(coeffs[0], ty);
        for &k in &coeffs[1..] {
            let kc = self.constant(k, ty);
            p = self.fma(p, z, kc);
        }
        p
    }

    /// sin x (`quarter_turns` 0) or cos x (`quarter_turns` 1, since cos x = sin(x + π/2)):
    /// n = round(x · 2/π), r = x − n·π/2 by three fused multiply-adds with
    /// [`HALF_PI_PARTS`], then ±sin r or ±cos r by the quadrant (n + quarter_turns) mod 4,
    /// computed in floats so every lane stays a vector. Measured against f64 (a numpy
    /// simulation of these steps on 2e6 points; `tests/jit_ops.rs`'s sweep sees 1.3): at
    /// most 1.5 ulp for |x| ≤ 1e4 and near the
    /// zeros up to 6e4; past ≈1e5 the three parts of π/2 no longer cancel n·π/2 exactly
    /// and the error grows with |x|. ±inf and NaN give NaN. The reduction needs the host's
    /// FMA (every CPU smelt's kernels target has it): with a separate multiply and add,
    /// n·P1 rounds, and results near the zeros lose most of their bits past |x| ≈ 3.
    pub(super) fn sin_or_cos(&mut self, x: ClifValue, quarter_turns: f32) -> ClifValue {
        let ty = self.fb.func.dfg.value_type(x);
        let two_over_pi = self.constant(std::f32::consts::FRAC_2_PI, ty);
        let scaled = self.fb.ins().fmul(x, two_over_pi);
        let n = self.fb.ins().nearest(scaled);
        let minus_n = self.fb.ins().fneg(n);
        let mut r = x;
        for part in HALF_PI_PARTS {
            let p = self.constant(part, ty);
            r = self.fma(minus_n, p, r);
        }
        let z = self.fb.ins().fmul(r, r);
        // sin r = r + r·z·S(z), cos r = 1 + z·C(z)
        let s = self.polynomial(&SIN_TAYLOR, z);
        let sz = self.fb.ins().fmul(s, z);
        let sin_r = self.fma(sz, r, r);
        let c = self.polynomial(&COS_TAYLOR, z);
        let one = self.constant(1.0, ty);
        let cos_r = self.fma(c, z, one);
        // the quadrant q = m − 4·floor(m/4) and its parity, exact for every integer m
        let turns = self.constant(quarter_turns, ty);
        let m = self.fb.ins().fadd(n, turns);
        let quarter = self.constant(0.25, ty);
        let four = self.constant(4.0, ty);
        let m4 = self.fb.ins().fmul(m, quarter);
        let whole = self.fb.ins().floor(m4);
        let minus_four = self.fb.ins().fneg(four);
        let q = self.fma(whole, minus_four, m);
        let half = self.constant(0.5, ty);
        let two = self.constant(2.0, ty);
        let q2 = self.fb.ins().fmul(q, half);
        let pairs = self.fb.ins().floor(q2);
        let minus_two = self.fb.ins().fneg(two);
        let parity = self.fma(pairs, minus_two, q);
        let p = self.select(FloatCC::Equal, parity, one, cos_r, sin_r);
        let minus_p = self.fb.ins().fneg(p);
        self.select(FloatCC::GreaterThanOrEqual, q, two, minus_p, p)
    }

    /// atan x: |x| above tan(3π/8) as π/2 + atan(−1/|x|), above tan(π/8) as
    /// π/4 + atan((|x| − 1)/(|x| + 1)), so the polynomial [`ATAN_FIT`] sees |t| ≤ tan(π/8);
    /// the sign of x last. Measured against f64: at most 2.6 ulp over 2e6 random points
    /// in [−3, 3] (a numpy simulation of these steps; the sum with π/4 rounds twice) and
    /// 0.9 ulp on `tests/jit_ops.rs`'s sweep; ±inf gives ±π/2 and NaN gives NaN.
    pub(super) fn atan(&mut self, x: ClifValue) -> ClifValue {
        let ty = self.fb.func.dfg.value_type(x);
        let a = self.fb.ins().fabs(x);
        let one = self.constant(1.0, ty);
        let minus_one = self.constant(-1.0, ty);
        let zero = self.constant(0.0, ty);
        let tan_3pi_8 = self.constant(2.414_213_5, ty);
        let tan_pi_8 = self.constant(0.414_213_57, ty);
        let recip = self.fb.ins().fdiv(minus_one, a);
        let am1 = self.fb.ins().fsub(a, one);
        let ap1 = self.fb.ins().fadd(a, one);
        let ratio = self.fb.ins().fdiv(am1, ap1);
        let t = self.select(FloatCC::GreaterThan, a, tan_pi_8, ratio, a);
        let t = self.select(FloatCC::GreaterThan, a, tan_3pi_8, recip, t);
        let quarter_pi = self.constant(std::f32::consts::FRAC_PI_4, ty);
        let half_pi = self.constant(std::f32::consts::FRAC_PI_2, ty);
        let offset = self.select(FloatCC::GreaterThan, a, tan_pi_8, quarter_pi, zero);
        let offset = self.select(FloatCC::GreaterThan, a, tan_3pi_8, half_pi, offset);
        let s = self.fb.ins().fmul(t, t);
        let p = self.polynomial(&ATAN_FIT, s);
        let ps = self.fb.ins().fmul(p, s);
        let atan_t = self.fma(ps, t, t);
        let y = self.fb.ins().fadd(offset, atan_t);
        let minus_y = self.fb.ins().fneg(y);
        self.select(FloatCC::LessThan, x, zero, minus_y, y)
    }
}
