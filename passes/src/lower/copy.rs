//! Lowerings of data movement: transpose, slice, pad, expand, tile, concat, reorder
//! (row-major ↔ blocked) and reshape/flatten copies.

use smelt_ir::graph::{Func, Use, ValueDef};
use smelt_ir::loops::{Access, Affine, BufId, Expr, KernelBuilder, Width};
use smelt_ir::op::{PadAttrs, PadAxis, PadMode, SliceAttrs};
use smelt_ir::{DType, Diagnostic, Layout, Op, TensorType, Value};

use super::conv::transpose4;
use super::elementwise::{
    broadcast_strides, collapse, dims_name, emit_nest, index_of, loop_nest, row_major_strides,
    Epilogue,
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
    let every_second = dtype == DType::F32
        && st[0].last() == Some(&2)
        && st[1].last() == Some(&1)
        && cd.last().is_some_and(|&n| n > 4);
    if every_second {
        return even_lanes_nest(b, &cd, (src, &st[0], src_off), (dst, &st[1], dst_off));
    }
    if dtype == DType::F32 && !vectorize {
        let (src_st, dst_st) = (&st[0], &st[1]);
        if let Some(j) = transposed_axis(&cd, src_st, dst_st) {
            let layout = TransposeBlocks {
                dims: &cd,
                inner: j,
                src_st,
                dst_st,
            };
            return layout.emit(b, (src, src_off), (dst, dst_off));
        }
    }
    let scalar = Width::scalar(dtype);
    emit_nest(b, &cd, vectorize, &mut |b, idx, w| {
        let w = if w == Width::F32x4 { w } else { scalar };
        let v = Expr::load(src, index_of(&st[0], idx).plus(src_off), w);
        b.store(dst, index_of(&st[1], idx).plus(dst_off), v, w);
    });
}

/// [`copy_nest`] of a copy that reads every second element along the last (merged)
/// dimension and writes them contiguously (a stride-2 slice: YOLO's focus stem, 0.22 ms
/// one element at a time for 208 × 208 × 3): vectors of 4 from two loads and an even-lanes
/// shuffle. The second load of a vector reads one element past the last one the vector
/// takes, so the vectors stop one vector short of where that element could lie past the
/// copy's own reads (the last vector reads no further than the last element copied),
/// and the rest go one by one.
fn even_lanes_nest(
    b: &mut KernelBuilder,
    dims: &[usize],
    (src, src_st, src_off): (BufId, &[i64], i64),
    (dst, dst_st, dst_off): (BufId, &[i64], i64),
) {
    let last = dims.len() - 1;
    let n = dims[last] as i64;
    let main = (n - 1) / 4 * 4;
    let w4 = Width::F32x4;
    loop_nest(b, &dims[..last], &mut |b, outer| {
        let outer: Vec<Affine> = outer.iter().map(|&v| Affine::var(v)).collect();
        let at = |st: &[i64], i: &Affine, off: i64| {
            index_of(&st[..last], &outer)
                .add(&i.scale(st[last]))
                .plus(off)
        };
        b.for_loop(0, main, 4, |b, i| {
            let s = at(src_st, &Affine::var(i), src_off);
            let pairs = [
                Expr::load(src, s.clone(), w4),
                Expr::load(src, s.plus(4), w4),
            ];
            let [low, high] = pairs;
            let v = Expr::shuffle(low, high, [0, 2, 4, 6]);
            b.store(dst, at(dst_st, &Affine::var(i), dst_off), v, w4);
        });
        b.for_loop(main, n, 1, |b, i| {
            let v = Expr::load(src, at(src_st, &Affine::var(i), src_off), Width::Scalar);
            b.store(dst, at(dst_st, &Affine::var(i), dst_off), v, Width::Scalar);
        });
    });
}

/// The axis a copy walks contiguously in its source, when its destination is contiguous
/// along another — the last one — and both run for at least one vector of 4: a
/// transpose that moves that axis inwards (YOLO's heads: `[3, 85, 52·52]` to
/// `[3, 52·52, 85]`).
fn transposed_axis(dims: &[usize], src_st: &[i64], dst_st: &[i64]) -> Option<usize> {
    let last = dims.len().checked_sub(1)?;
    if dst_st[last] != 1 || src_st[last] == 1 || dims[last] < 4 {
        return None;
    }
    (0..last).find(|&j| src_st[j] == 1 && dst_st[j] != 1 && dims[j] >= 4)
}

/// An f32 copy whose source is contiguous along axis `inner` and whose destination is
/// contiguous along the last axis, computed in 4×4 blocks: four vector loads along
/// `inner` (one per destination column), a transpose in registers, four vector stores
/// along the last axis. Element by element, every load and store was scalar, one
/// element per ≈ 3 cycles (YOLO's head transposes: 0.56 ms for 0.7 M elements).
struct TransposeBlocks<'a> {
    dims: &'a [usize],
    inner: usize,
    src_st: &'a [i64],
    dst_st: &'a [i64],
}

impl TransposeBlocks<'_> {
    fn emit(
        &self,
        b: &mut KernelBuilder,
        (src, src_off): (BufId, i64),
        (dst, dst_off): (BufId, i64),
    ) {
        let last = self.dims.len() - 1;
        let outer: Vec<usize> = (0..last).filter(|&a| a != self.inner).collect();
        self.outer_loops(b, &outer, &mut Vec::new(), (src, src_off), (dst, dst_off));
    }

    /// Loops over the `outer` axes, then the blocks of the inner and last axes.
    fn outer_loops(
        &self,
        b: &mut KernelBuilder,
        outer: &[usize],
        at: &mut Vec<(usize, Affine)>,
        (src, src_off): (BufId, i64),
        (dst, dst_off): (BufId, i64),
    ) {
        if let Some((&axis, rest)) = outer.split_first() {
            b.for_loop(0, self.dims[axis] as i64, 1, |b, i| {
                at.push((axis, Affine::var(i)));
                self.outer_loops(b, rest, at, (src, src_off), (dst, dst_off));
                at.pop();
            });
            return;
        }
        let base = |st: &[i64], off: i64| {
            at.iter().fold(Affine::constant(off), |acc, (a, i)| {
                acc.add(&i.scale(st[*a]))
            })
        };
        let (src_base, dst_base) = (base(self.src_st, src_off), base(self.dst_st, dst_off));
        let (j, last) = (self.inner, self.dims.len() - 1);
        let (sj, sl, dj) = (self.src_st[j], self.src_st[last], self.dst_st[j]);
        let (nj, nl) = (self.dims[j] as i64, self.dims[last] as i64);
        let (j4, l4) = (nj / 4 * 4, nl / 4 * 4);
        let (w4, s1) = (Width::F32x4, Width::Scalar);
        let scalar = |b: &mut KernelBuilder, jj: &Affine, ll: &Affine| {
            let from = src_base.add(&jj.scale(sj)).add(&ll.scale(sl));
            let to = dst_base.add(&jj.scale(dj)).add(ll);
            b.store(dst, to, Expr::load(src, from, s1), s1);
        };
        b.for_loop(0, j4, 4, |b, j0| {
            let j0 = Affine::var(j0);
            b.for_loop(0, l4, 4, |b, l0| {
                let l0 = Affine::var(l0);
                // rows[r]: 4 source elements along `inner` at destination column l0 + r
                let rows: Vec<Expr> = (0..4)
                    .map(|r| {
                        let from = src_base.add(&j0.scale(sj)).add(&l0.plus(r).scale(sl));
                        b.let_(Expr::load(src, from, w4), w4)
                    })
                    .collect();
                for (k, v) in transpose4(b, &rows).into_iter().enumerate() {
                    let to = dst_base.add(&j0.plus(k as i64).scale(dj)).add(&l0);
                    b.store(dst, to, v, w4);
                }
            });
            b.for_loop(l4, nl, 1, |b, l| {
                let l = Affine::var(l);
                for k in 0..4 {
                    scalar(b, &j0.plus(k), &l);
                }
            });
        });
        b.for_loop(j4, nj, 1, |b, jj| {
            let jj = Affine::var(jj);
            b.for_loop(0, nl, 1, |b, l| scalar(b, &jj, &Affine::var(l)));
        });
    }
}

/// The data-movement ops [`lower_copy`] computes, as the lowering dispatch hands them
/// over (so its match is exhaustive).
#[derive(Clone, Copy, Debug)]
pub(crate) enum CopyOp<'a> {
    /// `transpose` by the permutation.
    Transpose(&'a [usize]),
    /// `slice`.
    Slice(&'a SliceAttrs),
    /// `pad`.
    Pad(&'a PadAttrs),
    /// `expand` (to the result's dims).
    Expand,
    /// `tile` by the repeats.
    Tile(&'a [usize]),
    /// `concat` along the axis.
    Concat(usize),
    /// A reshape or flatten copied (only as a fused anchor, never valid).
    Reshape,
    /// `reorder` to the layout.
    Reorder(Layout),
}

impl CopyOp<'_> {
    fn name(self) -> &'static str {
        match self {
            CopyOp::Transpose(_) => "transpose",
            CopyOp::Slice(_) => "slice",
            CopyOp::Pad(_) => "pad",
            CopyOp::Expand => "expand",
            CopyOp::Tile(_) => "tile",
            CopyOp::Concat(_) => "concat",
            CopyOp::Reshape => "reshape",
            CopyOp::Reorder(_) => "reorder",
        }
    }
}

/// transpose, slice, expand, tile, concat, reorder (row-major ↔ blocked), and reshape/flatten copies.
pub(crate) fn lower_copy(
    cx: &mut Cx,
    op: CopyOp,
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
        CopyOp::Transpose(perm) => {
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
        CopyOp::Slice(sl) => {
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
        CopyOp::Pad(p) => {
            let in_dims = cx.func.type_of(operands[0]).dims.clone();
            let axes = p.axes(&in_dims).map_err(|m| cx.unsupported(m))?;
            let fill = srcs.get(1).copied();
            pad(
                &mut b,
                p.mode,
                (&in_dims, &axes),
                dtype,
                (srcs[0], fill),
                (ya, out_dims),
            )
            .map_err(|m| cx.unsupported(m))?;
        }
        CopyOp::Expand => {
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
        CopyOp::Tile(repeats) => {
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
        CopyOp::Concat(axis) if out_ty.layout != Layout::RowMajor => {
            // in channel blocks, whole blocks along the blocked axis (the type rule):
            // each operand's storage is, per index of the axes before `axis`, one run
            // of the result's — a concatenation of 2-D views [outer, run]
            let outer: usize = out_dims[..axis].iter().product();
            let out_run = (cx.len_of(out) / outer.max(1)) as i64;
            let mut offset = 0i64;
            for (i, &v) in operands.iter().enumerate() {
                let run = (cx.len_of(cx.buf(v)) / outer.max(1)) as i64;
                let d = [outer, run as usize];
                copy_nest(
                    &mut b,
                    dtype,
                    &d,
                    (srcs[i], &[run, 1], 0),
                    (ya, &[out_run, 1], offset),
                );
                offset += run;
            }
        }
        CopyOp::Concat(axis) => {
            let mut offset = 0i64;
            for (i, &v) in operands.iter().enumerate() {
                let d = cx.func.type_of(v).dims.clone();
                let st = row_major_strides(&d);
                let at = offset * out_st[axis];
                copy_nest(&mut b, dtype, &d, (srcs[i], &st, 0), (ya, &out_st, at));
                offset += d[axis] as i64;
            }
        }
        CopyOp::Reshape => {
            let n = out_ty.num_elements();
            copy_nest(&mut b, dtype, &[n], (srcs[0], &[1], 0), (ya, &[1], 0));
        }
        CopyOp::Reorder(layout) => {
            let from = cx.func.type_of(operands[0]).clone();
            if dtype != DType::F32 {
                return Err(cx.unsupported("a reorder of a tensor that is not f32"));
            }
            reorder(&mut b, &from, layout, srcs[0], ya, cx.len_of(out))
                .map_err(|m| cx.unsupported(m))?;
        }
    }
    cx.step(b.finish(), args)
}

/// Whether instruction `i` is a slice computed inside the slices that read it, with no
/// kernel and no buffer of its own ([`composed_slice`]; `uses`: the function's use
/// lists): a plain row-major slice read only by plain slices (and no function result).
/// YOLO's stem takes the four pixel phases of the image as two slices of rows, each
/// read by two slices of columns: 6 kernels and 2 intermediate images where 4 strided
/// reads of the image do.
pub(crate) fn inlined_into_slices(func: &Func, uses: &[Vec<Use>], i: usize) -> bool {
    let inst = &func.insts[i];
    let value_uses = &uses[func.inst_value(i).index()];
    let read_by_slices = !value_uses.is_empty()
        && value_uses.iter().all(|u| match *u {
            Use::Operand { inst: reader, .. } => matches!(func.insts[reader].op, Op::Slice(_)),
            Use::Result(_) => false,
        });
    let row_major = |t: &TensorType| t.layout == Layout::RowMajor;
    matches!(inst.op, Op::Slice(_))
        && read_by_slices
        && row_major(&inst.ty)
        && inst.operands.iter().all(|&v| row_major(func.type_of(v)))
}

/// The source and attributes of slice `sl` of `x` read through every slice computed
/// inside it ([`inlined_into_slices`]): along each axis, index `i` of a slice of a slice of
/// `source` reads `source[s₁ + (s₂ + i·t₂)·t₁]`, a start of `s₁ + s₂·t₁` and a step of
/// `t₁·t₂`. The result's dims are the outer slice's; only starts and steps are read.
pub(crate) fn composed_slice(cx: &Cx, x: Value, sl: &SliceAttrs) -> (Value, SliceAttrs) {
    let mut composed = sl.clone();
    let mut source = x;
    while let Some(ValueDef::Inst(i)) = cx.func.def(source) {
        let inner = &cx.func.insts[i];
        let (Op::Slice(s1), true) = (&inner.op, cx.inlined.get(i) == Some(&true)) else {
            break;
        };
        for k in 0..composed.starts.len() {
            composed.starts[k] = s1.starts[k] + composed.starts[k] * s1.steps[k];
            composed.steps[k] *= s1.steps[k];
        }
        source = inner.operands[0];
    }
    (source, composed)
}

/// Concatenation without a copy: where every operand's elements are one contiguous run
/// of the result (nothing but size-1 axes before `axis`: batch 1 along channels, say;
/// row-major, or in channel blocks of whole blocks),
/// each operand's buffer is placed inside the result's at its run
/// ([`BufferKind::Within`](super::BufferKind::Within)), so the kernels computing the
/// operands write the result directly and no kernel runs for the concatenation. YOLO's
/// and DBNet's feature-pyramid concatenations copied 0.5–1.5 ms per run.
///
/// Returns false, changing nothing, unless every operand is a temporary of the result's
/// layout and element type, distinct, not yet placed inside another concatenation's
/// result, whose run starts on a 4-byte word (the memory plan's unit; no kernel or
/// routine assumes more alignment: every data access is an unaligned one).
pub(crate) fn concat_in_place(
    cx: &mut Cx,
    axis: usize,
    operands: &[Value],
    out_ty: &TensorType,
    out: BufferId,
) -> bool {
    // row-major, or in blocks along `axis` (whole blocks, the type rule says)
    let laid_out = match out_ty.layout {
        Layout::RowMajor => true,
        Layout::Blocked { axis: a, .. } => a as usize == axis,
    };
    if !laid_out
        || out_ty.dims[..axis.min(out_ty.dims.len())]
            .iter()
            .any(|&d| d != 1)
    {
        return false;
    }
    let size = out_ty.dtype.size_bytes();
    let mut runs = Vec::with_capacity(operands.len());
    let mut offset = 0usize;
    for &v in operands {
        let (ty, buf) = (cx.func.type_of(v), cx.buf(v));
        let b = &cx.prog.buffers[buf.0 as usize];
        let fits = ty.layout == out_ty.layout
            && ty.dtype == out_ty.dtype
            && b.dtype == out_ty.dtype
            && b.len == ty.storage_len()
            && matches!(b.kind, super::BufferKind::Temp)
            && (offset * size).is_multiple_of(4)
            && !runs.iter().any(|&(other, _)| other == buf);
        if !fits {
            return false;
        }
        runs.push((buf, offset));
        offset += b.len;
    }
    if offset != cx.len_of(out) {
        return false;
    }
    for (buf, offset) in runs {
        cx.prog.buffers[buf.0 as usize].kind = super::BufferKind::Within {
            parent: out,
            offset,
        };
    }
    true
}

/// Most boxes a non-constant `pad` may copy: their count is the product over axes of
/// each axis's pieces (3 but for `wrap` around a short axis), and each is a loop nest.
const MAX_PAD_BOXES: usize = 4096;

/// One run of result indices along one axis of a `pad` that reads the input at an
/// affine position: result `out_start + i` reads input `src_start + i * src_step`.
#[derive(Clone, Copy, Debug)]
struct PadPiece {
    out_start: usize,
    len: usize,
    src_start: i64,
    src_step: i64,
}

/// The pieces of one axis in a mode that reads the input everywhere (reflect, edge,
/// wrap): the kept input, and the runs before and after it, each an affine read
/// (reflect walks backwards, edge stays put, wrap is split where it wraps around).
fn pad_pieces(mode: PadMode, ax: &PadAxis) -> Vec<PadPiece> {
    let (crop, kept) = (ax.crop_begin as i64, ax.kept as i64);
    let end_start = ax.pad_begin + ax.kept;
    let piece = |out_start, len, src_start, src_step| PadPiece {
        out_start,
        len,
        src_start,
        src_step,
    };
    let mut out = vec![piece(ax.pad_begin, ax.kept, crop, 1)];
    match mode {
        // no pieces outside: the constant fills them
        PadMode::Constant => {}
        PadMode::Edge => {
            out.push(piece(0, ax.pad_begin, crop, 0));
            out.push(piece(end_start, ax.pad_end, crop + kept - 1, 0));
        }
        PadMode::Reflect => {
            // result i < pad_begin reads kept index pad_begin - i; after the input,
            // result end_start + i reads kept index kept - 2 - i
            out.push(piece(0, ax.pad_begin, crop + ax.pad_begin as i64, -1));
            out.push(piece(end_start, ax.pad_end, crop + kept - 2, -1));
        }
        PadMode::Wrap => {
            for (from, to) in [(0, ax.pad_begin), (end_start, end_start + ax.pad_end)] {
                let mut i = from;
                while i < to {
                    let j = (i as i64 - ax.pad_begin as i64).rem_euclid(kept);
                    let len = ((kept - j) as usize).min(to - i);
                    out.push(piece(i, len, crop + j, 1));
                    i += len;
                }
            }
        }
    }
    out.retain(|p| p.len > 0);
    out
}

/// `pad` into `dst` (dims `out_dims`) from `src` (the input, of `in_dims` resolved
/// into `axes`).
/// Constant mode stores the fill in the slabs around the kept input — along axis `k`,
/// the pads of axis `k` across the kept range of the axes before it and all of the
/// axes after it, so each result element is stored once — and copies the kept input
/// (vectorized for `f32`). The other modes copy one box per combination of the axes'
/// pieces.
fn pad(
    b: &mut KernelBuilder,
    mode: PadMode,
    (in_dims, axes): (&[usize], &[PadAxis]),
    dtype: DType,
    (src, fill): (BufId, Option<BufId>),
    (dst, out_dims): (BufId, &[usize]),
) -> Result<(), String> {
    let rank = axes.len();
    let out_st = row_major_strides(out_dims);
    let in_st = row_major_strides(in_dims);
    if mode == PadMode::Constant {
        let scalar = Width::scalar(dtype);
        // the fill is read once, before any loop
        let value = match fill {
            Some(f) => b.let_(Expr::load(f, Affine::constant(0), scalar), scalar),
            None if dtype == DType::F32 => Expr::constant(0.0, Width::Scalar),
            None => Expr::int(0, scalar),
        };
        let before: i64 = (0..rank)
            .map(|j| axes[j].pad_begin as i64 * out_st[j])
            .sum();
        for k in 0..rank {
            let ax = &axes[k];
            for (start, len) in [(0, ax.pad_begin), (ax.pad_begin + ax.kept, ax.pad_end)] {
                let mut dims: Vec<usize> = axes[..k].iter().map(|a| a.kept).collect();
                dims.push(len);
                dims.extend_from_slice(&out_dims[k + 1..]);
                let off: i64 = (0..k)
                    .map(|j| axes[j].pad_begin as i64 * out_st[j])
                    .sum::<i64>()
                    + start as i64 * out_st[k];
                let at = Affine::constant(off);
                fill_nest(b, dtype, &dims, &value, (dst, &out_st, &at));
            }
        }
        let kept: Vec<usize> = axes.iter().map(|a| a.kept).collect();
        let src_off: i64 = (0..rank)
            .map(|j| axes[j].crop_begin as i64 * in_st[j])
            .sum();
        copy_nest(
            b,
            dtype,
            &kept,
            (src, &in_st, src_off),
            (dst, &out_st, before),
        );
        return Ok(());
    }
    let pieces: Vec<Vec<PadPiece>> = axes.iter().map(|a| pad_pieces(mode, a)).collect();
    let boxes = pieces
        .iter()
        .try_fold(1usize, |n, p| n.checked_mul(p.len()))
        .filter(|&n| n <= MAX_PAD_BOXES)
        .ok_or_else(|| {
            format!(
                "a {} pad that copies more than {MAX_PAD_BOXES} boxes (wrap pads much longer than their axis)",
                mode.name()
            )
        })?;
    let mut pick = vec![0usize; rank];
    for _ in 0..boxes {
        let chosen: Vec<PadPiece> = (0..rank).map(|k| pieces[k][pick[k]]).collect();
        let dims: Vec<usize> = chosen.iter().map(|p| p.len).collect();
        let src_st: Vec<i64> = (0..rank).map(|k| chosen[k].src_step * in_st[k]).collect();
        let src_off: i64 = (0..rank).map(|k| chosen[k].src_start * in_st[k]).sum();
        let dst_off: i64 = (0..rank)
            .map(|k| chosen[k].out_start as i64 * out_st[k])
            .sum();
        copy_nest(
            b,
            dtype,
            &dims,
            (src, &src_st, src_off),
            (dst, &out_st, dst_off),
        );
        for k in (0..rank).rev() {
            pick[k] += 1;
            if pick[k] < pieces[k].len() {
                break;
            }
            pick[k] = 0;
        }
    }
    Ok(())
}

/// Stores `value` (a scalar) in `dims` elements of `dst` (strides `st`, from `off`,
/// which may read enclosing loops' variables), vectorized for `f32` when the last dim
/// is contiguous.
pub(super) fn fill_nest(
    b: &mut KernelBuilder,
    dtype: DType,
    dims: &[usize],
    value: &Expr,
    (dst, st, off): (BufId, &[i64], &Affine),
) {
    if dims.contains(&0) {
        return;
    }
    let (cd, st) = collapse(dims, &[st.to_vec()]);
    let vectorize = dtype == DType::F32 && st[0].last() == Some(&1);
    let scalar = Width::scalar(dtype);
    emit_nest(b, &cd, vectorize, &mut |b, idx, w| {
        let (v, w) = if w == Width::F32x4 {
            (Expr::splat_to(value.clone(), w), w)
        } else {
            (value.clone(), scalar)
        };
        b.store(dst, index_of(&st[0], idx).add(off), v, w);
    });
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
