//! The BN-fold weight transform: a conv weight with each output channel's row scaled,
//! held unevaluated so that weight packers fold the scale in as they pack.
//!
//! `const_fold` makes a `bn_fold_weight` of a constant into such a buffer
//! ([`ScaledRows::buffer`]); the conv and Winograd packers, which rewrite every conv
//! weight anyway, find the source and the factors ([`ScaledRows::parts`]) and apply
//! them element by element ([`ScaledRows::value`]), so ResNet-50's 94 MB of folded
//! weights are never written out (they were a fifth of its compile time). Anything else
//! that reads the data (the interpreter, the printer) gets it computed once, with the
//! same formula, so every reader sees the same bits.

use std::sync::Arc;

use smelt_ir::weights::{AlignedBuf, Derivation};

/// The f32 values of `source` with row `r` (of `source.len() / scale.len()` elements)
/// multiplied by `scale[r]` in f64 and rounded to f32.
pub struct ScaledRows {
    source: Arc<AlignedBuf>,
    scale: Vec<f64>,
}

impl ScaledRows {
    /// `source`'s f32 values with row `r` multiplied by `scale[r]`, the rows being
    /// `scale.len()` equal parts of `source`, as a buffer computed on first read. `None`
    /// when `scale` does not divide `source` into whole rows.
    pub fn buffer(source: Arc<AlignedBuf>, scale: Vec<f64>) -> Option<AlignedBuf> {
        let len = source.as_f32().len();
        if scale.is_empty() || !len.is_multiple_of(scale.len()) {
            return None;
        }
        Some(AlignedBuf::derived(Arc::new(ScaledRows { source, scale })))
    }

    /// For a buffer made by [`ScaledRows::buffer`]: the source values and the per-row
    /// factors; element `i` is [`ScaledRows::value`]`(values[i], scale[i / row])` with
    /// `row = values.len() / scale.len()`.
    pub fn parts(buf: &AlignedBuf) -> Option<(&[f32], &[f64])> {
        buf.derivation::<ScaledRows>()
            .map(|s| (s.source.as_f32(), s.scale.as_slice()))
    }

    /// A packer's view of a weight of `rows` rows: for scaled rows with one factor per
    /// row, the source values and the factors (the packer folds them in as it reads, so
    /// the folded copy is never written); otherwise the buffer's values and no factors.
    pub fn rows_of(buf: &AlignedBuf, rows: usize) -> (&[f32], Option<&[f64]>) {
        match ScaledRows::parts(buf) {
            Some((values, scale)) if scale.len() == rows => (values, Some(scale)),
            _ => (buf.as_f32(), None),
        }
    }

    /// One element: `x` in a row scaled by `alpha`, bit-identical to what reading the
    /// buffer gives. (Inlined: packers call it once per weight element.)
    #[inline]
    pub fn value(x: f32, alpha: f64) -> f32 {
        (f64::from(x) * alpha) as f32
    }
}

impl Derivation for ScaledRows {
    fn len_bytes(&self) -> usize {
        self.source.as_f32().len() * 4
    }

    fn compute(&self, out: &mut [u8]) {
        let src = self.source.as_f32();
        let row = src.len() / self.scale.len().max(1);
        if row == 0 {
            return;
        }
        let rows = out.chunks_exact_mut(row * 4).zip(src.chunks_exact(row));
        for ((dst, src), &alpha) in rows.zip(&self.scale) {
            for (d, &x) in dst.chunks_exact_mut(4).zip(src) {
                d.copy_from_slice(&ScaledRows::value(x, alpha).to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scaled-rows buffer reads as the scaled values, exposes its parts, refuses
    /// partial rows, and is copied when detached (it would keep its source alive).
    #[test]
    fn scaled_rows_compute_on_read() {
        let src: Vec<f32> = (0..12).map(|i| i as f32 - 3.5).collect();
        let source = Arc::new(AlignedBuf::from_f32(&src));
        let scale = vec![0.5, -2.0, 1.0 / 3.0];
        assert!(ScaledRows::buffer(source.clone(), vec![1.0; 5]).is_none());
        assert!(ScaledRows::buffer(source.clone(), Vec::new()).is_none());
        let b = ScaledRows::buffer(source.clone(), scale.clone()).unwrap();
        let (values, factors) = ScaledRows::parts(&b).expect("parts");
        assert_eq!(values, &src[..]);
        assert_eq!(factors, &scale[..]);
        let want: Vec<f32> = src
            .iter()
            .enumerate()
            .map(|(i, &x)| (x as f64 * scale[i / 4]) as f32)
            .collect();
        assert_eq!(b.as_f32(), &want[..]);
        assert_eq!(b.len_bytes(), 48);
        assert_eq!(ScaledRows::value(src[5], scale[1]), want[5]);
        let b = Arc::new(b);
        let kept = AlignedBuf::detached(&b);
        assert!(ScaledRows::parts(&kept).is_none(), "an owned copy");
        assert_eq!(kept.as_f32(), &want[..]);
        assert!(ScaledRows::parts(&source).is_none());
    }
}
