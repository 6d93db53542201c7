//! Conversions between `f32` and the 2-byte float formats `f16` (IEEE-754 binary16) and
//! `bf16` (bfloat16), on their bit patterns.
//!
//! Written with integer bit operations rather than taken from a crate because the JIT
//! emits the very same steps (`src/codegen/translate.rs`), and the interpreter, the
//! oracle, should compute what the generated code computes by the same argument. Both
//! widen exactly and narrow with round-to-nearest-even, as numpy, `ml_dtypes` and
//! onnxruntime do: overflow rounds to infinity, subnormals are kept, NaN stays a quiet
//! NaN of the same sign. The f16 subnormals go through one f32 multiplication or
//! addition each way, so they need the default floating-point environment (no
//! flush-to-zero or denormals-are-zero mode set by a host program), as f32 subnormals do.

/// The `f32` whose value the `f16` bit pattern `h` holds (exact).
pub fn f16_to_f32(h: u16) -> f32 {
    let magnitude = u32::from(h & 0x7fff);
    let sign = u32::from(h & 0x8000) << 16;
    // Shifted into f32's fields, an f16 of exponent e reads as 2^(e-15) / 2^112 (for
    // subnormals too, as an f32 subnormal), so one exact multiplication by 2^112
    // rebiases it; infinity and NaN (exponent all ones) take f32's all-ones exponent.
    let bits = if magnitude >= 0x7c00 {
        0x7f80_0000 | (magnitude << 13)
    } else {
        (f32::from_bits(magnitude << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(sign | bits)
}

/// The `f16` bit pattern nearest to `x` (ties to even; beyond 65504 by half an ulp or
/// more, infinity; NaN a quiet NaN).
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let a = bits & 0x7fff_ffff;
    let magnitude = if a > 0x7f80_0000 {
        // NaN: the top payload bits, quiet
        0x7e00 | ((a >> 13) & 0x3ff) as u16
    } else if a >= 0x477f_f000 {
        // 65520 and above (infinity included) round to infinity
        0x7c00
    } else if a < 0x3880_0000 {
        // below f16's smallest normal 2^-14: adding 0.5 lines the f16 subnormal ulp
        // 2^-24 up with the f32 ulp at 0.5, so the hardware addition rounds (to
        // nearest even) exactly where f16 must, and the low bits are the result
        (f32::from_bits(a) + 0.5)
            .to_bits()
            .wrapping_sub(0x3f00_0000) as u16
    } else {
        // normal: rebias the exponent (127 - 15 = 112), round the 13 dropped bits to
        // nearest even; a carry out of the mantissa correctly bumps the exponent
        let odd = (a >> 13) & 1;
        ((a - (112 << 23) + 0xfff + odd) >> 13) as u16
    };
    sign | magnitude
}

/// The `f32` whose value the `bf16` bit pattern `b` holds (exact: bf16 is f32's upper
/// half).
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits(u32::from(b) << 16)
}

/// The `bf16` bit pattern nearest to `x` (ties to even, overflow to infinity, NaN a
/// quiet NaN) — rounding, not the truncation some converters do.
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if bits & 0x7fff_ffff > 0x7f80_0000 {
        return ((bits >> 16) | 0x40) as u16;
    }
    let odd = (bits >> 16) & 1;
    // cannot overflow u32: the largest finite magnitude plus 0x8000 stays below 2^32
    (bits.wrapping_add(0x7fff + odd) >> 16) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_then_narrowing_is_the_identity_on_every_non_nan_pattern() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            if x.is_nan() {
                assert!(f32_to_f16(x) & 0x7fff > 0x7c00, "{h:#x}");
            } else {
                assert_eq!(f32_to_f16(x), h, "f16 {h:#x} = {x}");
            }
            let y = bf16_to_f32(h);
            if !y.is_nan() {
                assert_eq!(f32_to_bf16(y), h, "bf16 {h:#x}");
            }
        }
    }

    #[test]
    fn narrowing_rounds_ties_to_even_and_overflows_to_infinity() {
        // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: to even (1)
        assert_eq!(f32_to_f16(1.0 + f32::powi(2.0, -11)), 0x3c00);
        // 1 + 3·2^-11 is halfway between 1+2^-10 (odd) and 1+2^-9: up
        assert_eq!(f32_to_f16(1.0 + 3.0 * f32::powi(2.0, -11)), 0x3c02);
        assert_eq!(f32_to_f16(65504.0), 0x7bff);
        assert_eq!(f32_to_f16(65519.99), 0x7bff);
        assert_eq!(f32_to_f16(65520.0), 0x7c00);
        assert_eq!(f32_to_f16(-f32::INFINITY), 0xfc00);
        // smallest subnormal 2^-24; half of it ties to even (zero), a bit more rounds up
        assert_eq!(f32_to_f16(f32::powi(2.0, -24)), 0x0001);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25)), 0x0000);
        assert_eq!(f32_to_f16(f32::powi(2.0, -25) * 1.0001), 0x0001);
        assert_eq!(f32_to_f16(-0.0), 0x8000);
        // bf16: 1 + 2^-8 ties to 1, 1 + 3·2^-8 ties up; truncation would differ on
        // 1 + 2^-8 + 2^-20, which rounds up
        assert_eq!(f32_to_bf16(1.0 + f32::powi(2.0, -8)), 0x3f80);
        assert_eq!(f32_to_bf16(1.0 + 3.0 * f32::powi(2.0, -8)), 0x3f82);
        assert_eq!(
            f32_to_bf16(1.0 + f32::powi(2.0, -8) + f32::powi(2.0, -20)),
            0x3f81
        );
        assert_eq!(f32_to_bf16(f32::MAX), 0x7f80);
        assert!(bf16_to_f32(f32_to_bf16(f32::NAN)).is_nan());
    }
}
