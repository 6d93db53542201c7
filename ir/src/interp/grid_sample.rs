//! `grid_sample`: each result element's taps along every spatial axis
//! ([`GridSampleAttrs::taps`], the arithmetic lowering writes out too), their weights
//! multiplied and the products summed in f64.

use super::Arg;
use crate::op::GridSampleAttrs;

/// `x: [N, C, D1 .. Dr]` sampled at `grid: [N, H1 .. Hk, r]` into `[N, C, H1 .. Hk]`.
pub(super) fn grid_sample(g: &GridSampleAttrs, x: &Arg, grid: &Arg, out: &[usize]) -> Vec<f32> {
    let (n, c) = (out[0], out[1]);
    let spatial = &x.dims[2..];
    let r = spatial.len();
    let points: usize = out[2..].iter().product();
    let plane: usize = spatial.iter().product();
    let axes: Vec<_> = spatial.iter().map(|&d| g.axis(d)).collect();
    // row-major strides of the spatial axes
    let mut strides = vec![1usize; r];
    for k in (0..r.saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * spatial[k + 1];
    }
    let mut result = vec![0.0f32; n * c * points];
    for b in 0..n {
        for p in 0..points {
            // the grid's last axis holds the last spatial axis's coordinate first
            let at = (b * points + p) * r;
            let taps: Vec<Vec<(usize, f64)>> = (0..r)
                .map(|k| g.taps(&axes[k], f64::from(grid.data[at + r - 1 - k])))
                .collect();
            // every combination of one tap per axis: its offset and weight
            let mut terms: Vec<(usize, f64)> = vec![(0, 1.0)];
            for (k, axis_taps) in taps.iter().enumerate() {
                let stride = strides[k];
                terms = terms
                    .iter()
                    .flat_map(|&(o, w)| {
                        axis_taps
                            .iter()
                            .map(move |&(i, tw)| (o + i * stride, w * tw))
                    })
                    .collect();
            }
            for ch in 0..c {
                let base = (b * c + ch) * plane;
                let sum: f64 = terms
                    .iter()
                    // a weight of 0 contributes nothing, even next to an infinity
                    .filter(|(_, w)| *w != 0.0)
                    .map(|&(o, w)| w * f64::from(x.data[base + o]))
                    .sum();
                result[(b * c + ch) * points + p] = sum as f32;
            }
        }
    }
    result
}
