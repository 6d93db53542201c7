//! Pooling kernels over NCHW: max, average (both padding conventions) and global average.

use super::Arg;
use crate::op::Pool2dAttrs;

/// The taps of a pooling window along one axis, as input coordinates (possibly outside
/// `0..input`, i.e. in the padding or past it).
fn taps(p: &Pool2dAttrs, axis: usize, out_index: usize) -> impl Iterator<Item = isize> {
    let start = (out_index * p.strides[axis]) as isize - p.pads[axis] as isize;
    let dilation = p.dilations[axis] as isize;
    (0..p.kernel[axis] as isize).map(move |k| start + k * dilation)
}

/// Calls `f(plane, out_plane)` for every (n, c) plane of the input and output.
fn for_each_plane(x: &Arg, out: &[usize], mut f: impl FnMut(&[f32], &mut [f32])) -> Vec<f32> {
    let (in_plane, out_plane) = (x.dims[2] * x.dims[3], out[2] * out[3]);
    let planes = out[0] * out[1];
    let mut result = vec![0.0f32; planes * out_plane];
    for p in 0..planes {
        f(
            &x.data[p * in_plane..(p + 1) * in_plane],
            &mut result[p * out_plane..(p + 1) * out_plane],
        );
    }
    result
}

/// Max over each window's input elements; padding never wins. NaN propagates; a window
/// without any input element yields NaN.
pub(super) fn max_pool2d(p: &Pool2dAttrs, x: &Arg, out: &[usize]) -> Vec<f32> {
    let (h, w) = (x.dims[2] as isize, x.dims[3] as isize);
    let (oh, ow) = (out[2], out[3]);
    for_each_plane(x, out, |plane, result| {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut best: Option<f32> = None;
                for iy in taps(p, 0, oy).filter(|&iy| (0..h).contains(&iy)) {
                    for ix in taps(p, 1, ox).filter(|&ix| (0..w).contains(&ix)) {
                        let v = plane[(iy * w + ix) as usize];
                        best = Some(match best {
                            Some(b) if b.is_nan() || b >= v => b,
                            _ => v,
                        });
                    }
                }
                result[oy * ow + ox] = best.unwrap_or(f32::NAN);
            }
        }
    })
}

/// Mean over each window. With `count_include_pad` the divisor counts the taps inside
/// the padded extent `[-pad_begin, input + pad_end)` (taps hanging past the end padding in
/// ceil mode are not counted, as in ONNX); without it, only taps on input elements.
pub(super) fn avg_pool2d(
    p: &Pool2dAttrs,
    count_include_pad: bool,
    x: &Arg,
    out: &[usize],
) -> Vec<f32> {
    let (h, w) = (x.dims[2] as isize, x.dims[3] as isize);
    let (oh, ow) = (out[2], out[3]);
    let padded_h = -(p.pads[0] as isize)..h + p.pads[2] as isize;
    let padded_w = -(p.pads[1] as isize)..w + p.pads[3] as isize;
    for_each_plane(x, out, |plane, result| {
        for oy in 0..oh {
            for ox in 0..ow {
                let mut sum = 0.0f64;
                let mut real = 0usize;
                for iy in taps(p, 0, oy).filter(|&iy| (0..h).contains(&iy)) {
                    for ix in taps(p, 1, ox).filter(|&ix| (0..w).contains(&ix)) {
                        sum += plane[(iy * w + ix) as usize] as f64;
                        real += 1;
                    }
                }
                let count = if count_include_pad {
                    let ys = taps(p, 0, oy).filter(|iy| padded_h.contains(iy)).count();
                    let xs = taps(p, 1, ox).filter(|ix| padded_w.contains(ix)).count();
                    ys * xs
                } else {
                    real
                };
                // An empty window is 0 / 0 = NaN, as in ONNX's reference.
                result[oy * ow + ox] = (sum / count as f64) as f32;
            }
        }
    })
}

/// Mean over all axes after the first two: `[N, C, ...] -> [N, C, 1, ...]`.
pub(super) fn global_avg_pool(x: &Arg) -> Vec<f32> {
    let inner: usize = x.dims[2..].iter().product();
    let planes = x.dims[0] * x.dims[1];
    (0..planes)
        .map(|p| {
            let plane = &x.data[p * inner..(p + 1) * inner];
            (plane.iter().map(|&v| v as f64).sum::<f64>() / inner as f64) as f32
        })
        .collect()
}
