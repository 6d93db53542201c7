//! Strided views: chains of row-major data movement (transpose, slice, reshape) that a
//! matrix product reads through strides instead of copies.
//!
//! Exporters split a fused Q/K/V projection into heads with a reshape, a transpose and a
//! slice per matrix, then transpose K once more for `Q·Kᵀ`: on ViT-small that is seven
//! copies per layer, each a kernel pass over a `[heads, tokens, 64]` tensor. Every one of
//! them only permutes, offsets or regroups the strides of the projection's result, and
//! the packed GEMM reads A through any row stride and packs B from any strides, so the
//! product reads the projection's buffer itself. A movement instruction is *viewed* (no
//! kernel, no buffer) when every reader of its value is a viewed instruction or a matrix
//! product whose operand view the packed GEMM takes ([`viewed_movement`]); the product
//! then finds its operand's source and strides with [`view_of`].

use smelt_ir::graph::{Func, Use, ValueDef};
use smelt_ir::op::Op;
use smelt_ir::{Layout, TensorType, Value};

/// A tensor of its value's dims, read from `source`'s row-major buffer at `offset +
/// Σ index[d] · strides[d]` (a stride of 0 on a size-1 dim).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct View {
    pub(crate) source: Value,
    pub(crate) offset: i64,
    pub(crate) strides: Vec<i64>,
}

impl View {
    /// The value itself: its row-major strides.
    fn plain(v: Value, ty: &TensorType) -> View {
        let mut strides = vec![0i64; ty.dims.len()];
        let mut s = 1i64;
        for (d, st) in ty.dims.iter().zip(&mut strides).rev() {
            *st = if *d == 1 { 0 } else { s };
            s *= *d as i64;
        }
        View {
            source: v,
            offset: 0,
            strides,
        }
    }
}

/// Whether instruction `i` moves data without computing (a transpose, a slice with
/// positive steps, a reshape or flatten), of row-major `f32` operand and result: a
/// candidate for a view.
fn is_movement(func: &Func, i: usize) -> bool {
    let inst = &func.insts[i];
    let plain = |t: &TensorType| t.layout == Layout::RowMajor && t.dtype == smelt_ir::DType::F32;
    let op_ok = match &inst.op {
        Op::Transpose { .. } | Op::Reshape { .. } | Op::Flatten { .. } => true,
        Op::Slice(s) => s.steps.iter().all(|&t| t > 0) && s.starts.iter().all(|&t| t >= 0),
        _ => false,
    };
    op_ok
        && inst.operands.len() == 1
        && inst.ty.dims.iter().all(|&d| d > 0)
        && plain(&inst.ty)
        && plain(func.type_of(inst.operands[0]))
}

/// The view of `v` through the movement instructions `through` admits, from the first
/// value up its producers that is not one; `None` when a reshape on the way regroups
/// dims that do not run on evenly in the view below it.
pub(crate) fn view_of(func: &Func, v: Value, through: &dyn Fn(usize) -> bool) -> Option<View> {
    let ty = func.type_of(v);
    let Some(ValueDef::Inst(i)) = func.def(v) else {
        return Some(View::plain(v, ty));
    };
    if !through(i) {
        return Some(View::plain(v, ty));
    }
    let inst = &func.insts[i];
    let x = inst.operands[0];
    let inner = view_of(func, x, through)?;
    let in_dims = &func.type_of(x).dims;
    let out_dims = &inst.ty.dims;
    let zero_units = |mut view: View| {
        for (s, &d) in view.strides.iter_mut().zip(out_dims) {
            if d == 1 {
                *s = 0;
            }
        }
        view
    };
    match &inst.op {
        Op::Transpose { perm } => Some(zero_units(View {
            strides: perm.iter().map(|&p| inner.strides[p]).collect(),
            ..inner
        })),
        Op::Slice(s) => {
            let offset = s
                .starts
                .iter()
                .zip(&inner.strides)
                .map(|(&a, &st)| a * st)
                .sum::<i64>();
            Some(zero_units(View {
                offset: inner.offset + offset,
                strides: inner
                    .strides
                    .iter()
                    .zip(&s.steps)
                    .map(|(a, b)| a * b)
                    .collect(),
                source: inner.source,
            }))
        }
        Op::Reshape { .. } | Op::Flatten { .. } => {
            regrouped(in_dims, &inner.strides, out_dims).map(|strides| View { strides, ..inner })
        }
        _ => None,
    }
}

/// The strides of `out_dims` over a tensor of `dims` with `strides`, when every group of
/// dims a reshape merges or splits runs on evenly (each dim's stride its inner
/// neighbour's times its size): as numpy decides whether a reshape can be a view.
fn regrouped(dims: &[usize], strides: &[i64], out_dims: &[usize]) -> Option<Vec<i64>> {
    // size-1 dims take no part: their strides are 0 on either side
    let ins: Vec<(usize, i64)> = dims
        .iter()
        .zip(strides)
        .filter(|(&d, _)| d != 1)
        .map(|(&d, &s)| (d, s))
        .collect();
    let outs: Vec<usize> = (0..out_dims.len()).filter(|&d| out_dims[d] != 1).collect();
    let mut result = vec![0i64; out_dims.len()];
    let (mut i, mut o) = (0, 0);
    while i < ins.len() && o < outs.len() {
        // the smallest groups ins[i..ie] and outs[o..oe] of equal size
        let (mut ie, mut oe) = (i + 1, o + 1);
        let (mut in_size, mut out_size) = (ins[i].0, out_dims[outs[o]]);
        while in_size != out_size {
            if in_size < out_size {
                in_size *= ins.get(ie)?.0;
                ie += 1;
            } else {
                out_size *= out_dims[*outs.get(oe)?];
                oe += 1;
            }
        }
        // the group's input dims run on evenly: one stride for the group's innermost
        let mut s = run_stride(&ins[i..ie])?.unwrap_or(0);
        for &d in outs[o..oe].iter().rev() {
            result[d] = s;
            s *= out_dims[d] as i64;
        }
        (i, o) = (ie, oe);
    }
    (i == ins.len() && o == outs.len()).then_some(result)
}

/// Whether dims of (extent, stride), outermost first, run on evenly as one dim — each
/// stride its inner neighbour's times that neighbour's extent, size-1 dims taking no
/// part — and then the stride of the innermost (`None` when every extent is 1).
pub(crate) fn run_stride(dims: &[(usize, i64)]) -> Option<Option<i64>> {
    let mut run: Option<(i64, i64)> = None; // (stride, extent) of the run so far
    for &(extent, stride) in dims.iter().rev().filter(|(e, _)| *e != 1) {
        run = match run {
            Some((s, e)) if stride != s * e => return None,
            Some((s, e)) => Some((s, e * extent as i64)),
            None => Some((stride, extent as i64)),
        };
    }
    Some(run.map(|(s, _)| s))
}

/// The matrix product a function computes at instruction `i`, if it is one: a matmul,
/// alone or as a fused op's anchor (operands 0 and 1 are A and B).
pub(crate) fn is_matmul(op: &Op) -> bool {
    match op {
        Op::MatMul => true,
        Op::Fused(f) => matches!(*f.anchor, Op::MatMul),
        _ => false,
    }
}

/// Which instructions are viewed: movement instructions every reader of which is
/// another viewed instruction or operand `k` of a matrix product with
/// `takes(product, k, view)`, for the view of that operand through the viewed
/// instructions above it. A chain whose upper part has other readers is cut there: the
/// product reads the view from the last value that is computed.
pub(crate) fn viewed_movement(
    func: &Func,
    uses: &[Vec<Use>],
    takes: &dyn Fn(usize, usize, &View) -> bool,
) -> Vec<bool> {
    let n = func.insts.len();
    let candidate: Vec<bool> = (0..n).map(|i| is_movement(func, i)).collect();
    // each product operand with the movement instructions above it (nearest first)
    let mut operands: Vec<(usize, usize, Vec<usize>)> = Vec::new();
    for (p, inst) in func.insts.iter().enumerate() {
        if !is_matmul(&inst.op) {
            continue;
        }
        for (k, &v) in inst.operands.iter().take(2).enumerate() {
            let mut chain = Vec::new();
            let mut at = v;
            while let Some(ValueDef::Inst(i)) = func.def(at) {
                if !candidate[i] {
                    break;
                }
                chain.push(i);
                at = func.insts[i].operands[0];
            }
            if !chain.is_empty() {
                operands.push((p, k, chain));
            }
        }
    }
    let mut viewed = vec![false; n];
    for (_, _, chain) in &operands {
        for &i in chain {
            viewed[i] = true;
        }
    }
    // Until nothing changes: an operand keeps the viewed part of its chain (up to the
    // first computed value) when the product takes the view through it; an instruction
    // stays viewed while some operand keeps it and every reader is viewed or such an
    // operand. Each round only removes, so this ends.
    loop {
        let mut kept = vec![false; n];
        let mut reads = Vec::new();
        for (p, k, chain) in &operands {
            let view = view_of(func, func.insts[*p].operands[*k], &|i| viewed[i]);
            if view.is_some_and(|v| takes(*p, *k, &v)) {
                for &i in chain.iter().take_while(|&&i| viewed[i]) {
                    kept[i] = true;
                }
                reads.push((*p, *k, chain[0]));
            }
        }
        let read_inside = |i: usize| {
            uses[func.inst_value(i).index()].iter().all(|u| match *u {
                Use::Operand { inst, operand } => kept[inst] || reads.contains(&(inst, operand, i)),
                Use::Result(_) => false,
            })
        };
        let next: Vec<bool> = (0..n).map(|i| kept[i] && read_inside(i)).collect();
        if next == viewed {
            return viewed;
        }
        viewed = next;
    }
}

#[cfg(test)]
mod tests {
    use super::{regrouped, run_stride};

    #[test]
    fn runs_of_dims() {
        // heads of 64 inside rows of 1152: they do not run on into the rows
        assert_eq!(run_stride(&[(197, 1152), (6, 64)]), None);
        // batch × rows of a row-major [2, 197, 384]: one run of 394 rows of 384
        assert_eq!(run_stride(&[(2, 197 * 384), (197, 384)]), Some(Some(384)));
        // size-1 dims take no part; none left: no stride
        assert_eq!(run_stride(&[(1, 7), (4, 3), (1, 0)]), Some(Some(3)));
        assert_eq!(run_stride(&[(1, 7)]), Some(None));
    }

    #[test]
    fn reshapes_of_strided_views() {
        // [197, 1152] split into [197, 3, 6, 64]: every stride from the row's
        assert_eq!(
            regrouped(&[197, 1152], &[1152, 1], &[197, 3, 6, 64]),
            Some(vec![1152, 384, 64, 1])
        );
        // one head's slice [197, 1, 384] (row stride 1152) as [197, 6, 64]
        assert_eq!(
            regrouped(&[197, 1, 384], &[1152, 0, 1], &[197, 6, 64]),
            Some(vec![1152, 64, 1])
        );
        // merging [6, 197] heads × tokens of a [197, 6, 64] view: they do not run on
        assert_eq!(regrouped(&[6, 197, 64], &[64, 1152, 1], &[1182, 64]), None);
        // merging dims that do run on, with size-1 dims on both sides
        assert_eq!(
            regrouped(&[1, 4, 1, 8], &[0, 8, 0, 1], &[32, 1]),
            Some(vec![1, 0])
        );
        // a contiguous [6, 4] is a contiguous [4, 6]; a transposed one is not
        assert_eq!(regrouped(&[6, 4], &[4, 1], &[4, 6]), Some(vec![6, 1]));
        assert_eq!(regrouped(&[6, 4], &[1, 6], &[4, 6]), None);
    }
}
