//! 2-D convolution over NCHW input and OIHW weights, and the transposed convolution
//! (a scatter of each input pixel onto its strided window), with f64 accumulation.
//!
//! The loop order is: output plane (n, o) → input channel of o's group → kernel tap
//! (ky, kx) → output row. For one tap the valid output columns form one range, so the
//! innermost loop is `acc_row[ox] += w * x_row[ox * stride + offset]` over a slice —
//! contiguous when the stride is 1, and over the whole plane at once when whole rows
//! line up (1×1 convs, the centre column of padded 3×3 convs).

use super::Arg;
use crate::op::{Conv2dAttrs, ConvTranspose2dAttrs};

/// The output indices `o` in `0..out_len` whose input coordinate
/// `o * stride + tap_offset - pad_begin` lies in `0..in_len`.
fn valid_range(
    out_len: usize,
    in_len: usize,
    stride: usize,
    tap_offset: usize,
    pad_begin: usize,
) -> std::ops::Range<usize> {
    // o * stride >= pad_begin - tap_offset
    let lo = pad_begin.saturating_sub(tap_offset).div_ceil(stride);
    // o * stride < in_len + pad_begin - tap_offset
    let hi = match (in_len + pad_begin).checked_sub(tap_offset) {
        Some(room) => room.div_ceil(stride).min(out_len),
        None => 0,
    };
    lo.min(hi)..hi
}

/// `out[n, o, y, x] = bias[o] + sum over c in o's group, ky, kx of
/// x[n, c, y*sh + ky*dh - pad_top, x*sw + kx*dw - pad_left] * w[o, c, ky, kx]`,
/// input positions outside the image counting as zero.
pub(super) fn conv2d(
    a: &Conv2dAttrs,
    x: &Arg,
    w: &Arg,
    bias: Option<&Arg>,
    out: &[usize],
) -> Vec<f32> {
    let [batch, in_channels, in_h, in_w] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let [out_channels, group_in, kernel_h, kernel_w] = [w.dims[0], w.dims[1], w.dims[2], w.dims[3]];
    let (out_h, out_w) = (out[2], out[3]);
    let [stride_h, stride_w] = a.strides;
    let [dil_h, dil_w] = a.dilations;
    let [pad_top, pad_left, _, _] = a.pads;
    let group_out = out_channels / a.groups;
    let (in_plane, out_plane) = (in_h * in_w, out_h * out_w);

    let mut result = vec![0.0f32; batch * out_channels * out_plane];
    let mut acc = vec![0.0f64; out_plane];
    for n in 0..batch {
        for o in 0..out_channels {
            acc.fill(bias.map_or(0.0, |b| b.data[o] as f64));
            let group = o / group_out;
            for ci in 0..group_in {
                let c = group * group_in + ci;
                let start = (n * in_channels + c) * in_plane;
                let plane = &x.data[start..start + in_plane];
                let taps =
                    &w.data[(o * group_in + ci) * kernel_h * kernel_w..][..kernel_h * kernel_w];
                for ky in 0..kernel_h {
                    let rows = valid_range(out_h, in_h, stride_h, ky * dil_h, pad_top);
                    for kx in 0..kernel_w {
                        let weight = taps[ky * kernel_w + kx] as f64;
                        let cols = valid_range(out_w, in_w, stride_w, kx * dil_w, pad_left);
                        if rows.is_empty() || cols.is_empty() {
                            continue;
                        }
                        // Input coordinates of the first valid output row and column.
                        let iy0 = rows.start * stride_h + ky * dil_h - pad_top;
                        let ix0 = cols.start * stride_w + kx * dil_w - pad_left;
                        let whole_rows = cols.len() == out_w && out_w == in_w && ix0 == 0;
                        if stride_w == 1 && stride_h == 1 && whole_rows {
                            // Consecutive output rows read consecutive input rows: one slice.
                            let acc_span = &mut acc[rows.start * out_w..rows.end * out_w];
                            let in_span = &plane[iy0 * in_w..][..acc_span.len()];
                            axpy(weight, in_span, acc_span);
                            continue;
                        }
                        for (r, oy) in rows.clone().enumerate() {
                            let in_row = &plane[(iy0 + r * stride_h) * in_w..][..in_w];
                            let acc_row = &mut acc[oy * out_w..][cols.clone()];
                            if stride_w == 1 {
                                axpy(weight, &in_row[ix0..ix0 + acc_row.len()], acc_row);
                            } else {
                                for (i, a) in acc_row.iter_mut().enumerate() {
                                    *a += weight * in_row[ix0 + i * stride_w] as f64;
                                }
                            }
                        }
                    }
                }
            }
            let dst = &mut result[(n * out_channels + o) * out_plane..][..out_plane];
            for (d, &v) in dst.iter_mut().zip(&acc) {
                *d = v as f32;
            }
        }
    }
    result
}

/// `out[n, g*O/g + o, y, x] = bias + sum over c in group g, ky, kx of
/// x[n, c, iy, ix] * w[c, o, ky, kx]` over the input pixels with
/// `iy*sh + ky*dh - pad_top = y` and `ix*sw + kx*dw - pad_left = x`: each input pixel
/// scatters onto its strided window, accumulated in f64 over one output plane.
pub(super) fn conv_transpose2d(
    a: &ConvTranspose2dAttrs,
    x: &Arg,
    w: &Arg,
    bias: Option<&Arg>,
    out: &[usize],
) -> Vec<f32> {
    let [batch, in_channels, in_h, in_w] = [x.dims[0], x.dims[1], x.dims[2], x.dims[3]];
    let [_, group_out, kernel_h, kernel_w] = [w.dims[0], w.dims[1], w.dims[2], w.dims[3]];
    let (out_channels, out_h, out_w) = (out[1], out[2], out[3]);
    let [stride_h, stride_w] = a.strides;
    let [dil_h, dil_w] = a.dilations;
    let [pad_top, pad_left, _, _] = a.pads;
    let group_in = in_channels / a.groups;
    let (in_plane, out_plane) = (in_h * in_w, out_h * out_w);
    // output coordinate of input position `i` through tap `k`, if inside the result
    let land = |i: usize, k: usize, stride: usize, dil: usize, pad: usize, len: usize| {
        (i * stride + k * dil).checked_sub(pad).filter(|&o| o < len)
    };

    let mut result = vec![0.0f32; batch * out_channels * out_plane];
    let mut acc = vec![0.0f64; out_plane];
    for n in 0..batch {
        for oc in 0..out_channels {
            acc.fill(bias.map_or(0.0, |b| b.data[oc] as f64));
            let (group, o) = (oc / group_out, oc % group_out);
            for ci in 0..group_in {
                let c = group * group_in + ci;
                let plane = &x.data[(n * in_channels + c) * in_plane..][..in_plane];
                let taps =
                    &w.data[(c * group_out + o) * kernel_h * kernel_w..][..kernel_h * kernel_w];
                for ky in 0..kernel_h {
                    for kx in 0..kernel_w {
                        let weight = taps[ky * kernel_w + kx] as f64;
                        for iy in 0..in_h {
                            let Some(y) = land(iy, ky, stride_h, dil_h, pad_top, out_h) else {
                                continue;
                            };
                            for ix in 0..in_w {
                                if let Some(xo) = land(ix, kx, stride_w, dil_w, pad_left, out_w) {
                                    acc[y * out_w + xo] += weight * plane[iy * in_w + ix] as f64;
                                }
                            }
                        }
                    }
                }
            }
            let dst = &mut result[(n * out_channels + oc) * out_plane..][..out_plane];
            for (d, &v) in dst.iter_mut().zip(&acc) {
                *d = v as f32;
            }
        }
    }
    result
}

/// `acc += weight * x`, elementwise in f64.
fn axpy(weight: f64, x: &[f32], acc: &mut [f64]) {
    for (a, &v) in acc.iter_mut().zip(x) {
        *a += weight * v as f64;
    }
}

/// `b[o] = sum over c, kh, kw of w[o,c,kh,kw] * t[group(o) * C/g + c]`, in f64: the bias a
/// per-input-channel shift `t` adds through an unpadded conv with weight `w[O,C/g,KH,KW]`.
pub(super) fn conv_shift_bias(w: &Arg, t: &[f32]) -> Vec<f32> {
    let (o, cg) = (w.dims[0], w.dims[1]);
    let k: usize = w.dims[2..].iter().product();
    let groups = t.len().checked_div(cg).unwrap_or(1).max(1);
    let per_group = (o / groups).max(1);
    (0..o)
        .map(|oc| {
            let first = (oc / per_group) * cg;
            let mut acc = 0.0f64;
            for c in 0..cg {
                let shift = t[first + c] as f64;
                let row = &w.data[(oc * cg + c) * k..(oc * cg + c + 1) * k];
                acc += row.iter().map(|&v| v as f64).sum::<f64>() * shift;
            }
            acc as f32
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::valid_range;

    #[test]
    fn valid_range_matches_brute_force() {
        for out_len in 0..6 {
            for in_len in 1..6 {
                for stride in 1..4 {
                    for tap in 0..7 {
                        for pad in 0..4 {
                            let want: Vec<usize> = (0..out_len)
                                .filter(|&o| {
                                    let i = (o * stride + tap) as isize - pad as isize;
                                    (0..in_len as isize).contains(&i)
                                })
                                .collect();
                            let got: Vec<usize> =
                                valid_range(out_len, in_len, stride, tap, pad).collect();
                            assert_eq!(got, want, "{out_len} {in_len} {stride} {tap} {pad}");
                        }
                    }
                }
            }
        }
    }
}
