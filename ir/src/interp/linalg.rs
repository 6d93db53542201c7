//! Matrix products: numpy `matmul` (batched, broadcasting, 1-D promotion) and ONNX `gemm`.

use super::shape::{broadcast_to, row_major_strides};
use super::Arg;
use crate::op::GemmAttrs;

/// `out[m, n] = sum_k a[m, k] * b[k, n]` for row-major `a` (m×k) and `b` (k×n), in f64,
/// appended to `out` (as f64, for the caller to scale or round).
fn matrix_product(a: &[f32], b: &[f32], m: usize, k: usize, n: usize, out: &mut Vec<f64>) {
    let mut row = vec![0.0f64; n];
    for i in 0..m {
        row.fill(0.0);
        for p in 0..k {
            let aip = a[i * k + p] as f64;
            for (acc, &bv) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *acc += aip * bv as f64;
            }
        }
        out.extend_from_slice(&row);
    }
}

/// Numpy matmul. A 1-D `a` is a row vector and a 1-D `b` a column vector (the promoted
/// axis is dropped from the result); leading (batch) axes broadcast.
pub(super) fn matmul(a: &Arg, b: &Arg, out: &[usize]) -> Vec<f32> {
    let a_dims: Vec<usize> = if a.dims.len() == 1 {
        vec![1, a.dims[0]]
    } else {
        a.dims.to_vec()
    };
    let b_dims: Vec<usize> = if b.dims.len() == 1 {
        vec![b.dims[0], 1]
    } else {
        b.dims.to_vec()
    };
    let (a_batch, a_mat) = a_dims.split_at(a_dims.len() - 2);
    let (b_batch, b_mat) = b_dims.split_at(b_dims.len() - 2);
    let (m, k, n) = (a_mat[0], a_mat[1], b_mat[1]);
    let batch_rank = a_batch.len().max(b_batch.len());
    let batch: Vec<usize> = out[..batch_rank].to_vec();
    let batches: usize = batch.iter().product();
    // Matrix index of each batch element in a and b (0 along broadcast axes).
    let matrix_strides = |own: &[usize]| -> Vec<usize> {
        let strides = row_major_strides(own);
        let lead = batch_rank - own.len();
        (0..batch_rank)
            .map(|d| {
                if d < lead || own[d - lead] == 1 {
                    0
                } else {
                    strides[d - lead]
                }
            })
            .collect()
    };
    let (a_strides, b_strides) = (matrix_strides(a_batch), matrix_strides(b_batch));
    let batch_strides = row_major_strides(&batch);
    let mut acc = Vec::with_capacity(batches * m * n);
    for bi in 0..batches {
        let (mut a_mat_index, mut b_mat_index) = (0, 0);
        for d in 0..batch_rank {
            let i = bi / batch_strides[d] % batch[d];
            a_mat_index += i * a_strides[d];
            b_mat_index += i * b_strides[d];
        }
        let a_m = &a.data[a_mat_index * m * k..(a_mat_index + 1) * m * k];
        let b_m = &b.data[b_mat_index * k * n..(b_mat_index + 1) * k * n];
        matrix_product(a_m, b_m, m, k, n, &mut acc);
    }
    acc.into_iter().map(|v| v as f32).collect()
}

/// `alpha * op(A) @ op(B) + beta * C`, `op` transposing when asked, `C` broadcast to
/// `[M, N]` (no `C` term when it is absent).
pub(super) fn gemm(g: &GemmAttrs, a: &Arg, b: &Arg, c: Option<&Arg>, out: &[usize]) -> Vec<f32> {
    let (m, n) = (out[0], out[1]);
    let transposed = |x: &Arg| -> Vec<f32> {
        let (rows, cols) = (x.dims[0], x.dims[1]);
        (0..cols)
            .flat_map(|j| (0..rows).map(move |i| (i, j)))
            .map(|(i, j)| x.data[i * cols + j])
            .collect()
    };
    let a_rm = if g.trans_a {
        transposed(a)
    } else {
        a.data.to_vec()
    };
    let b_rm = if g.trans_b {
        transposed(b)
    } else {
        b.data.to_vec()
    };
    let k = if g.trans_a { a.dims[0] } else { a.dims[1] };
    let mut acc = Vec::with_capacity(m * n);
    matrix_product(&a_rm, &b_rm, m, k, n, &mut acc);
    let (alpha, beta) = (g.alpha.0 as f64, g.beta.0 as f64);
    match c {
        Some(c) => {
            let c = broadcast_to(&c.data, c.dims, out);
            acc.iter()
                .zip(c.iter())
                .map(|(&p, &cv)| (alpha * p + beta * cv as f64) as f32)
                .collect()
        }
        None => acc.iter().map(|&p| (alpha * p) as f32).collect(),
    }
}
