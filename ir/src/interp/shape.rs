//! Data-movement kernels: strided gathers (broadcast, expand, tile, transpose, slice) and
//! concatenation, generic over the element type.

use crate::op::SliceAttrs;

/// Row-major strides of `dims`.
pub(super) fn row_major_strides(dims: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; dims.len()];
    for k in (0..dims.len().saturating_sub(1)).rev() {
        strides[k] = strides[k + 1] * dims[k + 1];
    }
    strides
}

/// Reads a tensor of shape `out_dims` in row-major order from `data`, where a step along
/// output axis `k` moves `strides[k]` elements in `data` (0 repeats, as in broadcasting).
pub(super) fn strided_gather<T: Copy>(data: &[T], out_dims: &[usize], strides: &[usize]) -> Vec<T> {
    let total: usize = out_dims.iter().product();
    let mut out = Vec::with_capacity(total);
    if total == 0 {
        return out;
    }
    let Some((&inner_len, outer_dims)) = out_dims.split_last() else {
        out.push(data[0]);
        return out;
    };
    let inner_stride = strides[outer_dims.len()];
    let mut idx = vec![0usize; outer_dims.len()];
    let mut base = 0usize;
    'rows: loop {
        out.extend((0..inner_len).map(|i| data[base + i * inner_stride]));
        // Advance the odometer over the outer axes, innermost first.
        let mut k = outer_dims.len();
        loop {
            if k == 0 {
                break 'rows;
            }
            k -= 1;
            idx[k] += 1;
            base += strides[k];
            if idx[k] < outer_dims[k] {
                continue 'rows;
            }
            base -= strides[k] * outer_dims[k];
            idx[k] = 0;
        }
    }
    out
}

/// `data` of shape `dims` broadcast (numpy rules) to `out_dims`, which the type rule has
/// checked to be the broadcast shape.
pub(super) fn broadcast_to<'a, T: Copy>(
    data: &'a [T],
    dims: &[usize],
    out_dims: &[usize],
) -> std::borrow::Cow<'a, [T]> {
    if dims == out_dims {
        return std::borrow::Cow::Borrowed(data);
    }
    let own = row_major_strides(dims);
    let lead = out_dims.len() - dims.len();
    let strides: Vec<usize> = (0..out_dims.len())
        .map(|k| {
            if k < lead || dims[k - lead] == 1 {
                0
            } else {
                own[k - lead]
            }
        })
        .collect();
    std::borrow::Cow::Owned(strided_gather(data, out_dims, &strides))
}

/// Result axis `i` is input axis `perm[i]`.
pub(super) fn transpose<T: Copy>(data: &[T], dims: &[usize], perm: &[usize]) -> Vec<T> {
    let own = row_major_strides(dims);
    let out_dims: Vec<usize> = perm.iter().map(|&p| dims[p]).collect();
    let strides: Vec<usize> = perm.iter().map(|&p| own[p]).collect();
    strided_gather(data, &out_dims, &strides)
}

/// `x` repeated `repeats[k]` times along each axis: a gather over the split dims
/// `[r0, d0, r1, d1, ...]` that stays put (stride 0) along each repeat.
pub(super) fn tile<T: Copy>(data: &[T], dims: &[usize], repeats: &[usize]) -> Vec<T> {
    let own = row_major_strides(dims);
    let mut split = Vec::with_capacity(2 * dims.len());
    let mut strides = Vec::with_capacity(2 * dims.len());
    for (k, &r) in repeats.iter().enumerate() {
        split.extend([r, dims[k]]);
        strides.extend([0, own[k]]);
    }
    strided_gather(data, &split, &strides)
}

/// The window of `x` that `s` selects (the type rule has checked every index it reads
/// is in bounds and computed `out_dims`).
pub(super) fn slice<T: Copy>(
    data: &[T],
    dims: &[usize],
    s: &SliceAttrs,
    out_dims: &[usize],
) -> Vec<T> {
    let own = row_major_strides(dims);
    let total: usize = out_dims.iter().product();
    let mut out = Vec::with_capacity(total);
    let mut idx = vec![0usize; out_dims.len()];
    for _ in 0..total {
        let at: i64 = (0..out_dims.len())
            .map(|k| (s.starts[k] + idx[k] as i64 * s.steps[k]) * own[k] as i64)
            .sum();
        out.push(data[at as usize]);
        for k in (0..out_dims.len()).rev() {
            idx[k] += 1;
            if idx[k] < out_dims[k] {
                break;
            }
            idx[k] = 0;
        }
    }
    out
}

/// Concatenation along `axis`: for each index of the axes before it, the operands'
/// blocks follow each other.
pub(super) fn concat<T: Copy>(parts: &[(&[usize], &[T])], axis: usize) -> Vec<T> {
    let outer: usize = parts[0].0[..axis].iter().product();
    let total: usize = parts.iter().map(|(_, data)| data.len()).sum();
    let mut out = Vec::with_capacity(total);
    for o in 0..outer {
        for (dims, data) in parts {
            let block: usize = dims[axis..].iter().product();
            out.extend_from_slice(&data[o * block..(o + 1) * block]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_walks_strides_in_row_major_order() {
        let data: Vec<f32> = (0..6).map(|v| v as f32).collect();
        // transpose of a 2x3: strides [1, 3] over out dims [3, 2]
        assert_eq!(
            strided_gather(&data, &[3, 2], &[1, 3]),
            vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
        );
        // rank 0 and empty shapes
        assert_eq!(strided_gather(&data, &[], &[]), vec![0.0]);
        assert!(strided_gather(&data, &[2, 0], &[3, 1]).is_empty());
    }

    #[test]
    fn broadcast_repeats_unit_and_missing_axes() {
        let col = [1.0, 2.0];
        assert_eq!(
            broadcast_to(&col, &[2, 1], &[2, 2, 3]).into_owned(),
            vec![1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
        );
        assert_eq!(row_major_strides(&[2, 3, 4]), vec![12, 4, 1]);
    }
}
