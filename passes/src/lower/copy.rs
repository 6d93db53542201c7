//! Lowerings of data movement: transpose, slice, expand, tile, concat, reorder (row-major ↔ blocked)
//! and reshape/flatten copies.

use smelt_ir::loops::{Access, Affine, BufId, Expr, KernelBuilder, Width};
use smelt_ir::{DType, Diagnostic, Layout, Op, TensorType, Value};

use super::elementwise::{
    broadcast_strides, collapse, dims_name, emit_nest, index_of, row_major_strides, Epilogue,
};
use super::{BufferId, Cx};

/// Copies `dims` elements of type `dtype` from `src` (element strides `src_st`, offset
/// `src_off`) to `dst` (strides `dst_st`, offset `dst_off`); `f32` copies are vectorized
/// along the last merged dimension when both sides are contiguous there.
fn copy_nest(
    b: &mut KernelBuilder,
    dtype: DType,
    dims: &[usize],
    (src, src_st, src_off): (BufId, &[i64], i64),
    (dst, dst_st, dst_off): (BufId, &[i64], i64),
) {
    if dims.contains(&0) {
        return;
    }
    let (cd, st) = collapse(dims, &[src_st.to_vec(), dst_st.to_vec()]);
    let vectorize = dtype == DType::F32 && st.iter().all(|s| s.last() == Some(&1));
    let scalar = Width::scalar(dtype);
    emit_nest(b, &cd, vectorize, &mut |b, idx, w| {
        let w = if w == Width::F32x4 { w } else { scalar };
        let v = Expr::load(src, index_of(&st[0], idx).plus(src_off), w);
        b.store(dst, index_of(&st[1], idx).plus(dst_off), v, w);
    });
}

/// transpose, slice, expand, tile, concat, reorder (row-major ↔ blocked), and reshape/flatten copies.
pub(crate) fn lower_copy(
    cx: &mut Cx,
    op: &Op,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if !epi.is_empty() {
        return Err(cx.unsupported("post-ops on a data movement op"));
    }
    let out_dims = &out_ty.dims;
    let mut b = KernelBuilder::new(&format!("{}_{}", op.name(), dims_name(out_dims)));
    let mut args = Vec::new();
    let srcs: Vec<BufId> = operands
        .iter()
        .enumerate()
        .map(|(i, &v)| {
            let buf = cx.buf(v);
            args.push(buf);
            b.typed_arg(
                &format!("in{i}"),
                cx.dtype_of(buf),
                cx.len_of(buf),
                Access::Read,
            )
        })
        .collect();
    let dtype = out_ty.dtype;
    let ya = b.typed_arg("out", dtype, cx.len_of(out), Access::Write);
    args.push(out);
    let out_st = row_major_strides(out_dims);
    match op {
        Op::Transpose { perm } => {
            let in_st = row_major_strides(&cx.func.type_of(operands[0]).dims);
            let src_st: Vec<i64> = perm.iter().map(|&p| in_st[p]).collect();
            copy_nest(
                &mut b,
                dtype,
                out_dims,
                (srcs[0], &src_st, 0),
                (ya, &out_st, 0),
            );
        }
        Op::Slice(sl) => {
            // along axis k the source moves `steps[k]` input rows per output index, from
            // `starts[k]` (negative steps walk backwards; the type rule keeps them in bounds)
            let in_st = row_major_strides(&cx.func.type_of(operands[0]).dims);
            let src_st: Vec<i64> = in_st.iter().zip(&sl.steps).map(|(s, t)| s * t).collect();
            let off: i64 = in_st.iter().zip(&sl.starts).map(|(s, t)| s * t).sum();
            copy_nest(
                &mut b,
                dtype,
                out_dims,
                (srcs[0], &src_st, off),
                (ya, &out_st, 0),
            );
        }
        Op::Expand { .. } => {
            // a broadcast axis reads the same input element (stride 0)
            let in_dims = &cx.func.type_of(operands[0]).dims;
            let src_st = broadcast_strides(in_dims, out_dims);
            copy_nest(
                &mut b,
                dtype,
                out_dims,
                (srcs[0], &src_st, 0),
                (ya, &out_st, 0),
            );
        }
        Op::Tile { repeats } => {
            // over the split dims [r0, d0, r1, d1, ...]: the source stays put along each
            // repeat, the destination jumps by a whole copy of that axis
            let in_dims = cx.func.type_of(operands[0]).dims.clone();
            let in_st = row_major_strides(&in_dims);
            let (mut split, mut src_st, mut dst_st) = (Vec::new(), Vec::new(), Vec::new());
            for (k, &r) in repeats.iter().enumerate() {
                split.extend([r, in_dims[k]]);
                src_st.extend([0, in_st[k]]);
                dst_st.extend([in_dims[k] as i64 * out_st[k], out_st[k]]);
            }
            copy_nest(
                &mut b,
                dtype,
                &split,
                (srcs[0], &src_st, 0),
                (ya, &dst_st, 0),
            );
        }
        Op::Concat { axis } => {
            let mut offset = 0i64;
            for (i, &v) in operands.iter().enumerate() {
                let d = cx.func.type_of(v).dims.clone();
                let st = row_major_strides(&d);
                let at = offset * out_st[*axis];
                copy_nest(&mut b, dtype, &d, (srcs[i], &st, 0), (ya, &out_st, at));
                offset += d[*axis] as i64;
            }
        }
        Op::Reshape { .. } | Op::Flatten { .. } => {
            let n = out_ty.num_elements();
            copy_nest(&mut b, dtype, &[n], (srcs[0], &[1], 0), (ya, &[1], 0));
        }
        Op::Reorder { layout } => {
            let from = cx.func.type_of(operands[0]).clone();
            if dtype != DType::F32 {
                return Err(cx.unsupported("a reorder of a tensor that is not f32"));
            }
            reorder(&mut b, &from, *layout, srcs[0], ya, cx.len_of(out))
                .map_err(|m| cx.unsupported(m))?;
        }
        _ => return Err(cx.unsupported("not a data movement op")),
    }
    cx.step(b.finish(), args)
}

/// Element strides of a tensor of logical `dims` stored in `layout`, over "split" dims:
/// the logical dims with the blocked axis split into (block index, lane), the lane last.
fn split_strides(dims: &[usize], layout: Layout, axis: usize, block: usize) -> Vec<i64> {
    let mut split: Vec<usize> = dims.to_vec();
    split[axis] = dims[axis].div_ceil(block);
    match layout {
        Layout::RowMajor => {
            let st = row_major_strides(dims);
            let mut s = st.clone();
            s[axis] = st[axis] * block as i64;
            s.push(st[axis]);
            s
        }
        Layout::Blocked { .. } => {
            split.push(block);
            row_major_strides(&split)
        }
    }
}

/// Copies between row-major and a blocked layout; padding lanes of a blocked result are zero.
fn reorder(
    b: &mut KernelBuilder,
    from: &TensorType,
    to: Layout,
    src: BufId,
    dst: BufId,
    dst_len: usize,
) -> Result<(), String> {
    let dims = &from.dims;
    let (blocked, axis, block) = match (from.layout, to) {
        (l1, l2) if l1 == l2 => {
            copy_nest(b, DType::F32, &[dst_len], (src, &[1], 0), (dst, &[1], 0));
            return Ok(());
        }
        (Layout::RowMajor, Layout::Blocked { axis, block }) => (to, axis, block),
        (Layout::Blocked { axis, block }, Layout::RowMajor) => (from.layout, axis, block),
        _ => return Err("reorder between two blocked layouts".into()),
    };
    let (axis, block) = (axis as usize, block as usize);
    let (src_layout, dst_layout) = if to == blocked {
        (Layout::RowMajor, blocked)
    } else {
        (blocked, Layout::RowMajor)
    };
    if to == blocked {
        // zero the padding lanes (and everything else, overwritten below)
        let main = (dst_len / 4 * 4) as i64;
        b.for_loop(0, main, 4, |b, i| {
            b.store(
                dst,
                Affine::var(i),
                Expr::constant(0.0, Width::F32x4),
                Width::F32x4,
            )
        });
        b.for_loop(main, dst_len as i64, 1, |b, i| {
            b.store(
                dst,
                Affine::var(i),
                Expr::constant(0.0, Width::Scalar),
                Width::Scalar,
            )
        });
    }
    let s_st = split_strides(dims, src_layout, axis, block);
    let d_st = split_strides(dims, dst_layout, axis, block);
    let full = dims[axis] / block;
    let rest = dims[axis] % block;
    // full blocks, then the partial last block
    let mut split: Vec<usize> = dims.to_vec();
    split[axis] = full;
    split.push(block);
    copy_nest(b, DType::F32, &split, (src, &s_st, 0), (dst, &d_st, 0));
    if rest > 0 {
        let mut split: Vec<usize> = dims.to_vec();
        split[axis] = 1;
        split.push(rest);
        let off = |st: &[i64]| st[axis] * full as i64;
        copy_nest(
            b,
            DType::F32,
            &split,
            (src, &s_st, off(&s_st)),
            (dst, &d_st, off(&d_st)),
        );
    }
    Ok(())
}
