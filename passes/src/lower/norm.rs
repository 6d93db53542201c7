//! Lowerings of normalizations: layer_norm and softmax, and the row sum they share with
//! global average pooling.

use smelt_ir::loops::{
    Access, Affine, BinOp, BufId, BufPtr, Expr, KernelBuilder, LoopLimit, ReduceOp, UnOp, Width,
};
use std::collections::HashMap;

use smelt_ir::op::Op;
use smelt_ir::{DType, Diagnostic, TensorType, Value};

use super::copy::fill_nest;
use super::elementwise::{emit_nest, Epilogue};
use super::{BufferId, Cx};

/// The normalizations [`lower_norm`] computes, as the lowering dispatch hands them over
/// (so its match is exhaustive).
#[derive(Clone, Copy, Debug)]
pub(crate) enum NormOp {
    /// Layer normalization over axes `axis..`.
    LayerNorm {
        /// First normalized axis.
        axis: usize,
        /// Added to the variance.
        epsilon: f32,
    },
    /// Softmax along `axis`.
    Softmax {
        /// The axis.
        axis: usize,
    },
}

/// layer_norm and softmax; post-ops are not supported on them here (the caller lowers a
/// fused layer_norm's post-ops as a separate elementwise kernel).
pub(crate) fn lower_norm(
    cx: &mut Cx,
    op: NormOp,
    operands: &[Value],
    out_ty: &TensorType,
    epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    if !epi.is_empty() {
        return Err(cx.unsupported("post-ops on a normalization"));
    }
    let dims = &out_ty.dims;
    let x = cx.buf(operands[0]);
    match op {
        NormOp::LayerNorm { axis, epsilon } => {
            let outer: usize = dims[..axis].iter().product();
            let inner: usize = dims[axis..].iter().product();
            // rows that are a padded sequence's positions stop at a run's valid rows, the
            // rest cleared (`LowerOptions::padded_rows`): the value is `[1, …, 1, S, …]`
            // normalized after the sequence axis, so row `o` is position `o`
            let valid_rows = axis
                .checked_sub(1)
                .filter(|&s| dims[..s].iter().all(|&d| d == 1))
                .and_then(|s| cx.valid_rows_for(out, s));
            let stops = super::valid_rows_suffix(valid_rows.is_some());
            let mut b = KernelBuilder::new(&format!("layer_norm_{outer}x{inner}{stops}"));
            let xa = b.arg("x", cx.len_of(x), Access::Read);
            let sb = cx.buf(operands[1]);
            let sa = b.arg("scale", cx.len_of(sb), Access::Read);
            let mut args = vec![x, sb];
            let ba = operands.get(2).map(|&v| {
                let bb = cx.buf(v);
                args.push(bb);
                b.arg("bias", cx.len_of(bb), Access::Read)
            });
            let ya = b.arg("out", cx.len_of(out), Access::Write);
            args.push(out);
            let extent = valid_rows.map(|buf| {
                args.push(buf);
                b.typed_arg("valid_rows", DType::I64, 1, Access::Read)
            });
            let inv_n = (1.0f64 / inner as f64) as f32;
            let eps = epsilon;
            // rows are independent: threads share them
            b.set_parallel();
            b.for_loop(0, outer as i64, 1, |b, o| {
                let row = Affine::var(o);
                if let Some(extent) = extent {
                    let past = LoopLimit::at_or_past(extent, row.clone());
                    b.for_loop_limited(0, 1, 1, Some(past), |b, _| {
                        let zero = Expr::constant(0.0, Width::Scalar);
                        let at = row.scale(inner as i64);
                        fill_nest(b, DType::F32, &[inner], &zero, (ya, &[1], &at));
                    });
                }
                let normalize = |b: &mut KernelBuilder| {
                    let base = row.scale(inner as i64);
                    let sum = sum_row(b, xa, &base, inner, 1, |e| e);
                    let mean = pinned(
                        b,
                        Expr::binary(BinOp::Mul, sum, Expr::constant(inv_n, Width::Scalar)),
                    );
                    let mean4 = b.let_(Expr::Splat(Box::new(mean.clone())), Width::F32x4);
                    let sq = sum_row(b, xa, &base, inner, 1, |e| {
                        let m = match &e {
                            Expr::Load {
                                width: Width::F32x4,
                                ..
                            } => mean4.clone(),
                            _ => mean.clone(),
                        };
                        let d = Expr::binary(BinOp::Sub, e, m);
                        Expr::binary(BinOp::Mul, d.clone(), d)
                    });
                    let var = Expr::binary(BinOp::Mul, sq, Expr::constant(inv_n, Width::Scalar));
                    let rstd = pinned(
                        b,
                        Expr::binary(
                            BinOp::Div,
                            Expr::constant(1.0, Width::Scalar),
                            Expr::unary(
                                UnOp::Sqrt,
                                Expr::binary(BinOp::Add, var, Expr::constant(eps, Width::Scalar)),
                            ),
                        ),
                    );
                    emit_nest(b, &[inner], true, &mut |b, idx, w| {
                        let i = &idx[0];
                        let xv = Expr::load(xa, base.add(i), w);
                        let centered =
                            Expr::binary(BinOp::Sub, xv, Expr::splat_to(mean.clone(), w));
                        let normed =
                            Expr::binary(BinOp::Mul, centered, Expr::splat_to(rstd.clone(), w));
                        let scaled = Expr::binary(BinOp::Mul, normed, Expr::load(sa, i.clone(), w));
                        let v = match ba {
                            Some(bb) => {
                                Expr::binary(BinOp::Add, scaled, Expr::load(bb, i.clone(), w))
                            }
                            None => scaled,
                        };
                        b.store(ya, base.add(i), v, w);
                    });
                };
                // without valid rows the row is the same code as ever
                match extent {
                    Some(extent) => {
                        let below = Some(LoopLimit::below(extent, row.clone()));
                        b.for_loop_limited(0, 1, 1, below, |b, _| normalize(b))
                    }
                    None => normalize(b),
                }
            });
            cx.step(b.finish(), args)
        }
        NormOp::Softmax { axis } => {
            let outer: usize = dims[..axis].iter().product();
            let len = dims[axis];
            let inner: usize = dims[axis + 1..].iter().product();
            let mut b = KernelBuilder::new(&format!("softmax_{outer}x{len}x{inner}"));
            let xa = b.arg("x", cx.len_of(x), Access::Read);
            let ya = b.arg("out", cx.len_of(out), Access::Write);
            let args = vec![x, out];
            // lanes run along `inner` when it is long enough, else along the axis itself;
            // rows are independent: threads share them
            b.set_parallel();
            // Contiguous rows on a micro-kernel target call the native softmax-row
            // routine: Cranelift's f32x4 exponential bound the Cranelift row (BERT's
            // attention rows of 128: 0.23 ms per layer at 1.15 ns per element).
            let native = inner == 1 && cx.opts.micro.is_some();
            b.for_loop(0, outer as i64, 1, |b, o| {
                let base = Affine::var(o).scale((len * inner) as i64);
                if native {
                    let x = BufPtr {
                        buf: xa,
                        index: base.clone(),
                    };
                    let y = BufPtr {
                        buf: ya,
                        index: base,
                    };
                    b.softmax_row(x, y, len as i64);
                } else if inner == 1 {
                    softmax_row(b, xa, ya, &base, len);
                } else {
                    emit_nest(b, &[inner], true, &mut |b, idx, w| {
                        softmax_strided(b, xa, ya, &base.add(&idx[0]), len, inner, w);
                    });
                }
            });
            cx.step(b.finish(), args)
        }
    }
}

/// The softmaxes along the last axis of a row-major f32 matrix product's result that is
/// read by nothing else (attention's scores): product instruction → softmax
/// instruction. A product that finishes whole rows in blocks (the packed GEMM split by
/// heads) applies the softmax-row routine to each block in place while the rows are in
/// cache, and marks the softmax done; any other product leaves it to its own kernel.
pub(crate) fn softmax_after_products(
    func: &smelt_ir::graph::Func,
    uses: &[Vec<smelt_ir::graph::Use>],
) -> HashMap<usize, usize> {
    use smelt_ir::graph::ValueDef;
    let mut out = HashMap::new();
    for (s, inst) in func.insts.iter().enumerate() {
        let Op::Softmax { axis } = inst.op else {
            continue;
        };
        let ty = &inst.ty;
        let plain = ty.layout == smelt_ir::Layout::RowMajor && ty.dtype == smelt_ir::DType::F32;
        if !plain || axis + 1 != ty.rank() {
            continue;
        }
        let x = inst.operands[0];
        let Some(ValueDef::Inst(p)) = func.def(x) else {
            continue;
        };
        let only_reader = first_operand_of_one(uses, x) == Some(s);
        if only_reader && super::view::is_matmul(&func.insts[p].op) {
            out.insert(p, s);
        }
    }
    out
}

/// The instruction that reads `v` as its first operand and nothing else reads `v`.
fn first_operand_of_one(uses: &[Vec<smelt_ir::graph::Use>], v: smelt_ir::Value) -> Option<usize> {
    match uses[v.index()].as_slice() {
        [smelt_ir::graph::Use::Operand { inst, operand: 0 }] => Some(*inst),
        _ => None,
    }
}

/// Attention's second product: for a product whose softmax runs in place
/// ([`softmax_after_products`]), the plain matmul that is that softmax's one reader, as
/// its A (`P·V`), when everything else it reads is computed before the first product
/// (its B through the viewed movement above it: V's head split). The first product's
/// kernel may then compute `P·V` on each block of finished rows too, while they are in
/// cache: first product → second product.
pub(crate) fn attention_after_softmax(
    func: &smelt_ir::graph::Func,
    uses: &[Vec<smelt_ir::graph::Use>],
    softmax_after: &HashMap<usize, usize>,
    viewed: &[bool],
) -> HashMap<usize, usize> {
    use smelt_ir::graph::ValueDef;
    let mut out = HashMap::new();
    for (&p, &s) in softmax_after {
        let Some(q) = first_operand_of_one(uses, func.inst_value(s)) else {
            continue;
        };
        let second = &func.insts[q];
        if second.op != Op::MatMul {
            continue;
        }
        let ready = second.operands[1..].iter().all(|&v| {
            let Some(view) = super::view::view_of(func, v, &|i| viewed[i]) else {
                return false;
            };
            match func.def(view.source) {
                Some(ValueDef::Inst(i)) => i < p,
                Some(_) => true,
                None => false,
            }
        });
        if ready {
            out.insert(p, q);
        }
    }
    out
}

/// Of the second products of [`attention_after_softmax`], those whose one reader is a
/// row-major transpose keeping the last axis last (the head merge, `[B, H, S, D]` →
/// `[B, S, H, D]`) that is computed (not `inlined` into its readers or viewed by them),
/// which the product may write through: product → transpose.
pub(crate) fn merged_after_products(
    func: &smelt_ir::graph::Func,
    uses: &[Vec<smelt_ir::graph::Use>],
    attention_after: &HashMap<usize, usize>,
    inlined: &[bool],
) -> HashMap<usize, usize> {
    let mut out = HashMap::new();
    for &q in attention_after.values() {
        let v = func.inst_value(q);
        let Some(t) = first_operand_of_one(uses, v) else {
            continue;
        };
        let inst = &func.insts[t];
        let Op::Transpose { perm } = &inst.op else {
            continue;
        };
        let source = func.type_of(v);
        let plain = |ty: &smelt_ir::TensorType| {
            ty.layout == smelt_ir::Layout::RowMajor && ty.dtype == smelt_ir::DType::F32
        };
        let last = perm.len().wrapping_sub(1);
        let computed = !inlined[t];
        if computed && plain(source) && plain(&inst.ty) && perm.len() >= 2 && perm[last] == last {
            out.insert(q, t);
        }
    }
    out
}

/// `e`, a scalar computed after one loop for the next, stored in a one-element local
/// and read back where the loop IR computes it. Cranelift's e-graph places a pure value
/// at its first use and, measured on softmax rows, left a row's max reduction and its
/// `1/Σ` division inside the next loop, recomputed on every trip (4× the kernel's time);
/// a load is not pure, so it stays before the loop, and what is computed from it (a
/// splat) is hoisted out.
fn pinned(b: &mut KernelBuilder, e: Expr) -> Expr {
    let slot = b.local(1);
    b.store(slot, Affine::constant(0), e, Width::Scalar);
    b.let_(
        Expr::load(slot, Affine::constant(0), Width::Scalar),
        Width::Scalar,
    )
}

/// Softmax of `len` consecutive elements at `base`, vectorized along them.
fn softmax_row(b: &mut KernelBuilder, xa: BufId, ya: BufId, base: &Affine, len: usize) {
    let vec_end = (len / 4 * 4) as i64;
    let max = b.var(Width::Scalar);
    if vec_end > 0 {
        let m4 = b.var(Width::F32x4);
        b.assign(m4, Expr::load(xa, base.clone(), Width::F32x4));
        b.for_loop(4, vec_end, 4, |b, i| {
            let v = Expr::load(xa, base.add(&Affine::var(i)), Width::F32x4);
            b.assign(m4, Expr::binary(BinOp::Max, Expr::Var(m4), v));
        });
        b.assign(max, Expr::Reduce(ReduceOp::Max, Box::new(Expr::Var(m4))));
    } else {
        b.assign(max, Expr::load(xa, base.clone(), Width::Scalar));
    }
    b.for_loop(vec_end, len as i64, 1, |b, i| {
        let v = Expr::load(xa, base.add(&Affine::var(i)), Width::Scalar);
        b.assign(max, Expr::binary(BinOp::Max, Expr::Var(max), v));
    });
    let max = pinned(b, Expr::Var(max));
    let total = b.var(Width::Scalar);
    b.assign(total, Expr::constant(0.0, Width::Scalar));
    let max4 = b.let_(Expr::Splat(Box::new(max.clone())), Width::F32x4);
    if vec_end > 0 {
        let s4 = b.var(Width::F32x4);
        b.assign(s4, Expr::constant(0.0, Width::F32x4));
        b.for_loop(0, vec_end, 4, |b, i| {
            let at = base.add(&Affine::var(i));
            let x = Expr::load(xa, at.clone(), Width::F32x4);
            let e = b.let_(
                Expr::unary(UnOp::Exp, Expr::binary(BinOp::Sub, x, max4.clone())),
                Width::F32x4,
            );
            b.store(ya, at, e.clone(), Width::F32x4);
            b.assign(s4, Expr::binary(BinOp::Add, Expr::Var(s4), e));
        });
        b.assign(total, Expr::Reduce(ReduceOp::Add, Box::new(Expr::Var(s4))));
    }
    b.for_loop(vec_end, len as i64, 1, |b, i| {
        let at = base.add(&Affine::var(i));
        let x = Expr::load(xa, at.clone(), Width::Scalar);
        let e = b.let_(
            Expr::unary(UnOp::Exp, Expr::binary(BinOp::Sub, x, max.clone())),
            Width::Scalar,
        );
        b.store(ya, at, e.clone(), Width::Scalar);
        b.assign(total, Expr::binary(BinOp::Add, Expr::Var(total), e));
    });
    let inv = pinned(
        b,
        Expr::binary(
            BinOp::Div,
            Expr::constant(1.0, Width::Scalar),
            Expr::Var(total),
        ),
    );
    emit_nest(b, &[len], true, &mut |b, idx, w| {
        let at = base.add(&idx[0]);
        let v = Expr::binary(
            BinOp::Mul,
            Expr::load(ya, at.clone(), w),
            Expr::splat_to(inv.clone(), w),
        );
        b.store(ya, at, v, w);
    });
}

/// Softmax along an axis of stride `inner`, for `w.lanes()` neighbouring positions at once.
fn softmax_strided(
    b: &mut KernelBuilder,
    xa: BufId,
    ya: BufId,
    base: &Affine,
    len: usize,
    inner: usize,
    w: Width,
) {
    let at = |j: &Affine| base.add(&j.scale(inner as i64));
    let max = b.var(w);
    b.assign(max, Expr::load(xa, base.clone(), w));
    b.for_loop(1, len as i64, 1, |b, j| {
        let v = Expr::load(xa, at(&Affine::var(j)), w);
        b.assign(max, Expr::binary(BinOp::Max, Expr::Var(max), v));
    });
    let total = b.var(w);
    b.assign(total, Expr::constant(0.0, w));
    b.for_loop(0, len as i64, 1, |b, j| {
        let p = at(&Affine::var(j));
        let x = Expr::load(xa, p.clone(), w);
        let e = b.let_(
            Expr::unary(UnOp::Exp, Expr::binary(BinOp::Sub, x, Expr::Var(max))),
            w,
        );
        b.store(ya, p, e.clone(), w);
        b.assign(total, Expr::binary(BinOp::Add, Expr::Var(total), e));
    });
    let inv = b.let_(
        Expr::binary(BinOp::Div, Expr::constant(1.0, w), Expr::Var(total)),
        w,
    );
    b.for_loop(0, len as i64, 1, |b, j| {
        let p = at(&Affine::var(j));
        let v = Expr::binary(BinOp::Mul, Expr::load(ya, p.clone(), w), inv.clone());
        b.store(ya, p, v, w);
    });
}

/// Σ f(x[base + i·stride]) for i in 0..len, vectorized when `stride == 1`; returns a
/// scalar expression (a variable).
pub(super) fn sum_row(
    b: &mut KernelBuilder,
    buf: BufId,
    base: &Affine,
    len: usize,
    stride: i64,
    f: impl Fn(Expr) -> Expr,
) -> Expr {
    let vec_end = if stride == 1 { len / 4 * 4 } else { 0 } as i64;
    let total = b.var(Width::Scalar);
    if vec_end > 0 {
        let acc = b.var(Width::F32x4);
        b.assign(acc, Expr::constant(0.0, Width::F32x4));
        b.for_loop(0, vec_end, 4, |b, i| {
            let v = f(Expr::load(buf, base.add(&Affine::var(i)), Width::F32x4));
            b.assign(acc, Expr::binary(BinOp::Add, Expr::Var(acc), v));
        });
        b.assign(total, Expr::Reduce(ReduceOp::Add, Box::new(Expr::Var(acc))));
    } else {
        b.assign(total, Expr::constant(0.0, Width::Scalar));
    }
    b.for_loop(vec_end, len as i64, 1, |b, i| {
        let v = f(Expr::load(
            buf,
            base.add(&Affine::var(i).scale(stride)),
            Width::Scalar,
        ));
        b.assign(total, Expr::binary(BinOp::Add, Expr::Var(total), v));
    });
    Expr::Var(total)
}
