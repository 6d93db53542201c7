//! The transcendental functions the JIT expands into instruction sequences (Cranelift has
//! none): `log` and `exp` on f32 lanes, with the special values IEEE gives them.

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
        let mut p = self.constant(coeffs[0], ty);
        for &k in &coeffs[1..] {
            let kc = self.constant(k, ty);
            p = self.fma(p, r, kc);
        }
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
        let ty = self.fb.func.dfg.value_type(x);
        let (ity, vector) = if ty.is_vector() {
            (types::I32X4, true)
        } else {
            (types::I32, false)
        };
        let lo = self.constant(-87.3, ty);
        let hi = self.constant(88.3, ty);
        let input = x;
        let x = self.binary(BinOp::Max, x, lo);
        let x = self.binary(BinOp::Min, x, hi);
        // t = x·log2(e) + 1.5·2^23 rounds n = round(x·log2 e) into t's low mantissa bits.
        let magic = self.constant(12_582_912.0, ty);
        let log2e = self.constant(std::f32::consts::LOG2_E, ty);
        let t = self.fma(x, log2e, magic);
        let n = self.fb.ins().fsub(t, magic);
        let c1 = self.constant(-0.693_359_4, ty);
        let c2 = self.constant(2.121_944_4e-4, ty);
        let r = self.fma(n, c1, x);
        let r = self.fma(n, c2, r);
        let coeffs = [
            1.987_569_1e-4,
            1.398_199_9e-3,
            8.333_452e-3,
            4.166_579_6e-2,
            1.666_666_5e-1,
            0.5,
        ];
        let mut p = self.constant(coeffs[0], ty);
        for &k in &coeffs[1..] {
            let kc = self.constant(k, ty);
            p = self.fma(p, r, kc);
        }
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
