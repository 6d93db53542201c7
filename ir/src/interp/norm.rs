//! Normalizations and their weight preparation: batch norm (inference), layer norm,
//! softmax, and the BN-into-conv folding ops.

use super::Arg;
use crate::op::{ReduceAttrs, Reduction};

/// `(x - mean) / sqrt(var + eps) * scale + bias` per channel (axis 1).
/// `params` are `[scale, bias, mean, var]`.
pub(super) fn batch_norm(x: &Arg, params: [&Arg; 4], eps: f64) -> Vec<f32> {
    let [scale, bias, mean, var] = params.map(|p| &*p.data);
    let channels = x.dims[1];
    let inner: usize = x.dims[2..].iter().product();
    let mut out = Vec::with_capacity(x.data.len());
    // Each (n, c) plane of `inner` elements shares channel c's parameters.
    // An empty tensor has no chunks, so the `max(1)` only guards `chunks` itself.
    for (plane_index, plane) in x.data.chunks(inner.max(1)).enumerate() {
        let c = plane_index % channels;
        let inv_std = 1.0 / (var[c] as f64 + eps).sqrt();
        let (m, s, b) = (mean[c] as f64, scale[c] as f64, bias[c] as f64);
        out.extend(
            plane
                .iter()
                .map(|&v| ((v as f64 - m) * inv_std * s + b) as f32),
        );
    }
    out
}

/// Normalizes over the axes `axis..rank` with the biased variance, then applies
/// `scale` and the optional `bias` (both shaped like the normalized axes).
pub(super) fn layer_norm(
    x: &Arg,
    axis: usize,
    scale: &Arg,
    bias: Option<&Arg>,
    eps: f64,
) -> Vec<f32> {
    let inner: usize = x.dims[axis..].iter().product();
    let mut out = Vec::with_capacity(x.data.len());
    if inner == 0 {
        return out;
    }
    for row in x.data.chunks(inner) {
        let n = inner as f64;
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        let inv_std = 1.0 / (var + eps).sqrt();
        for (j, &v) in row.iter().enumerate() {
            let b = bias.map_or(0.0, |b| b.data[j] as f64);
            out.push(((v as f64 - mean) * inv_std * scale.data[j] as f64 + b) as f32);
        }
    }
    out
}

/// `exp(x - max) / sum(exp(x - max))` along `axis`, the max taken along the same axis.
pub(super) fn softmax(x: &Arg, axis: usize) -> Vec<f32> {
    let len = x.dims[axis];
    let inner: usize = x.dims[axis + 1..].iter().product();
    let outer: usize = x.dims[..axis].iter().product();
    let mut out = vec![0.0f32; x.data.len()];
    let mut exps = vec![0.0f64; len];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * len * inner + k * inner + i;
            let max = (0..len)
                .map(|k| x.data[at(k)] as f64)
                .fold(
                    f64::NEG_INFINITY,
                    |m, v| if v > m || v.is_nan() { v } else { m },
                );
            for (k, e) in exps.iter_mut().enumerate() {
                *e = (x.data[at(k)] as f64 - max).exp();
            }
            let sum: f64 = exps.iter().sum();
            for (k, e) in exps.iter().enumerate() {
                out[at(k)] = (e / sum) as f32;
            }
        }
    }
    out
}

/// `w * scale / sqrt(var + eps)`, one factor per output channel (axis 0), in f64.
pub(super) fn bn_fold_weight(w: &Arg, scale: &[f32], var: &[f32], eps: f64) -> Vec<f32> {
    let per_channel: usize = w.dims[1..].iter().product();
    let mut out = Vec::with_capacity(w.data.len());
    if per_channel == 0 {
        return out;
    }
    for (o, chunk) in w.data.chunks(per_channel).enumerate() {
        let alpha = scale[o] as f64 / (var[o] as f64 + eps).sqrt();
        out.extend(chunk.iter().map(|&v| (v as f64 * alpha) as f32));
    }
    out
}

/// `(conv_bias - mean) * scale / sqrt(var + eps) + bias` per channel, in f64;
/// `params` are `[scale, bias, mean, var]`, and a missing conv bias counts as 0.
pub(super) fn bn_fold_bias(params: [&[f32]; 4], conv_bias: Option<&[f32]>, eps: f64) -> Vec<f32> {
    let [scale, bias, mean, var] = params;
    (0..scale.len())
        .map(|c| {
            let alpha = scale[c] as f64 / (var[c] as f64 + eps).sqrt();
            let b0 = conv_bias.map_or(0.0, |b| b[c] as f64);
            ((b0 - mean[c] as f64) * alpha + bias[c] as f64) as f32
        })
        .collect()
}

/// `scale / sqrt(var + eps)` per channel, in f64 (BN's per-channel factor).
pub(super) fn bn_scale(scale: &[f32], var: &[f32], eps: f64) -> Vec<f32> {
    scale
        .iter()
        .zip(var)
        .map(|(&s, &v)| (s as f64 / (v as f64 + eps).sqrt()) as f32)
        .collect()
}

/// `w[o, ...] * s[o]` along `w`'s first axis, in f64.
pub(super) fn channel_scale(w: &Arg, s: &[f32]) -> Vec<f32> {
    let per_channel: usize = w.dims[1..].iter().product();
    let mut out = Vec::with_capacity(w.data.len());
    if per_channel == 0 {
        return out;
    }
    for (chunk, &f) in w.data.chunks(per_channel).zip(s) {
        out.extend(chunk.iter().map(|&v| (v as f64 * f as f64) as f32));
    }
    out
}

/// `r` of `x` over `attrs.axes`, each result element from its reduced elements in f64.
pub(super) fn reduce(r: Reduction, attrs: &ReduceAttrs, x: &Arg) -> Vec<f32> {
    // The result position of each input element: its index with the reduced axes
    // dropped, in row-major order over the kept axes.
    let kept: Vec<usize> = (0..x.dims.len())
        .filter(|k| !attrs.axes.contains(k))
        .collect();
    let out_len: usize = kept.iter().map(|&k| x.dims[k]).product();
    let mut groups: Vec<Vec<f64>> = vec![Vec::new(); out_len];
    let mut idx = vec![0usize; x.dims.len()];
    for &v in x.data.iter() {
        let o = kept.iter().fold(0, |acc, &k| acc * x.dims[k] + idx[k]);
        groups[o].push(v as f64);
        for k in (0..idx.len()).rev() {
            idx[k] += 1;
            if idx[k] < x.dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    groups
        .into_iter()
        .map(|g| r.eval(g.into_iter()) as f32)
        .collect()
}
