//! Lowerings of matrix products: on a micro-kernel target, B packed into panels for the
//! conv-tile routines ([`packed`]); else gemm and matmul as Cranelift register tiles, and
//! gemv for a single row of A against a `transB` B.

use smelt_ir::loops::{Access, Affine, BinOp, BufId, Expr, KernelBuilder, ReduceOp, VarId, Width};
use smelt_ir::op::GemmAttrs;
use smelt_ir::{Diagnostic, TensorType, Value};

use super::elementwise::{
    broadcast_strides, dims_name, index_of, load_lanes, row_major_strides, Epilogue,
};
use super::{view, BufferId, Cx};

mod packed;

/// Rows per register tile of a matrix product.
const GEMM_ROWS: usize = 3;
/// Vectors of 4 columns per register tile (GEMM_ROWS × GEMM_VECTORS ≤ 12).
const GEMM_VECTORS: usize = 3;

/// Geometry of a (batched) matrix product `out[b, m, n] = Σ_k A[b, m, k] · B[b, k, n]`.
struct GemmGeo {
    batch: Vec<usize>,
    a_batch: Vec<i64>,
    b_batch: Vec<i64>,
    m: usize,
    n: usize,
    k: usize,
    a_m: i64,
    a_k: i64,
    b_k: i64,
    b_n: i64,
    /// Result dims and which of them are m and n (matmul with vectors drops one).
    out_dims: Vec<usize>,
    has_m: bool,
    has_n: bool,
    alpha: f32,
    beta: f32,
    /// Where A's and B's first elements are in their buffers (not 0 only for a view).
    a_offset: i64,
    b_offset: i64,
}

impl GemmGeo {
    /// One row of A against a B whose k runs contiguously (a classifier's `transB`
    /// weights): dot products, reading B once in order, split over output columns.
    fn is_gemv(&self) -> bool {
        self.batch.is_empty() && self.m == 1 && self.b_k == 1 && self.k >= 16
    }

    /// The stride between consecutive rows of A taken across its batch dims as one run
    /// of rows, when they are evenly spaced (always for a row-major A; for a view, when
    /// its batch and row strides run on).
    fn merged_row_stride(&self) -> Option<i64> {
        let mut dims: Vec<(usize, i64)> = self
            .batch
            .iter()
            .copied()
            .zip(self.a_batch.iter().copied())
            .collect();
        dims.push((self.m, self.a_m));
        view::run_stride(&dims).map(|s| s.unwrap_or(self.a_m))
    }
}

/// The matrix products [`lower_gemm`] computes, as the lowering dispatch hands them over
/// (so its match is exhaustive).
#[derive(Clone, Copy, Debug)]
pub(crate) enum GemmOp<'a> {
    /// `alpha · op(A) · op(B) + beta · C`.
    Gemm(&'a GemmAttrs),
    /// Numpy matmul.
    MatMul,
}

impl GemmOp<'_> {
    fn name(self) -> &'static str {
        match self {
            GemmOp::Gemm(_) => "gemm",
            GemmOp::MatMul => "matmul",
        }
    }
}

pub(crate) fn lower_gemm(
    cx: &mut Cx,
    op: GemmOp<'_>,
    operands: &[Value],
    out_ty: &TensorType,
    mut epi: Epilogue,
    out: BufferId,
) -> Result<(), Diagnostic> {
    let at = cx.func.type_of(operands[0]).clone();
    let bt = cx.func.type_of(operands[1]).clone();
    let mut b_buf = cx.buf(operands[1]);
    let (mut geo, c_val) = match op {
        GemmOp::Gemm(g) => (gemm_geo(g, &at, out_ty), operands.get(2).copied()),
        GemmOp::MatMul => (matmul_geo(&at, &bt, out_ty), None),
    };
    // A matmul's operands read through the viewed movement above them (head splits and
    // transposes), which only the packed path takes (`takes_view` said so).
    let mut sources = [operands[0], operands[1]];
    if matches!(op, GemmOp::MatMul) {
        sources = read_through_views(cx, &mut geo, [operands[0], operands[1]])
            .ok_or_else(|| cx.unsupported("a viewed operand that is not a view"))?;
    }
    let viewed = sources != [operands[0], operands[1]];
    let b_viewed = sources[1] != operands[1];
    let gemv = geo.is_gemv();
    // On a micro-kernel target: B packed into panels (a constant at compile time, an
    // activation by a kernel) and the conv-tile routines.
    if !gemv {
        let weight = cx.const_weight(sources[1]);
        let b = match (cx.const_data(sources[1]), weight) {
            (Some(data), Some(weight)) if !b_viewed => packed::BSource::Constant(data, weight),
            _ => packed::BSource::Runtime(sources[1]),
        };
        let runtime_b = matches!(b, packed::BSource::Runtime(_));
        if let Some((plan, epi)) = packed::PackedGemm::plan(cx, &geo, &epi, runtime_b) {
            return plan.lower(cx, b, &geo, sources[0], c_val, epi, out);
        }
    }
    if viewed {
        return Err(cx.unsupported("an operand view the packed GEMM does not take"));
    }
    // A constant B read across its rows (gemm transB): transpose it once, here.
    if geo.b_n != 1 && geo.batch.is_empty() && !gemv {
        if let Some(data) = cx.const_data(operands[1]) {
            let (k, n) = (geo.k, geo.n);
            let (bk, bn) = (geo.b_k as usize, geo.b_n as usize);
            // deferred with the weight packing, and in 64×64 blocks: ResNet-50's FC
            // weight read down its columns took 13 ms (rows 8 KB apart share cache sets)
            let transpose = move |slab: &smelt_ir::ConstantSlab| {
                slab.f32_with(k * n, |t| {
                    for k0 in (0..k).step_by(64) {
                        for n0 in (0..n).step_by(64) {
                            for kk in k0..(k0 + 64).min(k) {
                                for nn in n0..(n0 + 64).min(n) {
                                    t[kk * n + nn] = data[kk * bk + nn * bn];
                                }
                            }
                        }
                    }
                })
            };
            b_buf = cx.constant_later("b_transposed", k * n, Box::new(transpose));
            geo.b_k = n as i64;
            geo.b_n = 1;
        }
    }
    let a_buf = cx.buf(operands[0]);
    let mut kb = KernelBuilder::new(&format!(
        "{}_{}x{}x{}_b{}",
        op.name(),
        geo.m,
        geo.n,
        geo.k,
        dims_name(&geo.batch)
    ));
    let aa = kb.arg("a", cx.len_of(a_buf), Access::Read);
    let ba = kb.arg("b", cx.len_of(b_buf), Access::Read);
    let mut args = vec![a_buf, b_buf];
    let c_arg = match c_val {
        Some(v) => {
            let cb = cx.buf(v);
            args.push(cb);
            let strides = broadcast_strides(&cx.func.type_of(v).dims, &[geo.m, geo.n]);
            Some((kb.arg("c", cx.len_of(cb), Access::Read), strides))
        }
        None => None,
    };
    args.extend(epi.declare(&mut kb));
    let ya = kb.arg("out", cx.len_of(out), Access::Write);
    args.push(out);
    let bufs = GemmBufs {
        a: aa,
        b: ba,
        c: c_arg,
        out: ya,
    };
    let out_strides = row_major_strides(&geo.out_dims);
    if gemv {
        gemv_kernel(&mut kb, &geo, &bufs, &epi, &out_strides);
        return cx.step(kb.finish(), args);
    }
    // batch loops
    fn batches(
        kb: &mut KernelBuilder,
        geo: &GemmGeo,
        d: usize,
        idx: &mut Vec<Affine>,
        body: &mut dyn FnMut(&mut KernelBuilder, &[Affine]),
    ) {
        if d == geo.batch.len() {
            body(kb, idx);
            return;
        }
        kb.for_loop(0, geo.batch[d] as i64, 1, |kb, i| {
            idx.push(Affine::var(i));
            batches(kb, geo, d + 1, idx, body);
            idx.pop();
        });
    }
    let vectorize = geo.b_n == 1;
    batches(&mut kb, &geo, 0, &mut Vec::new(), &mut |kb, bidx| {
        let a0 = index_of(&geo.a_batch, bidx);
        let b0 = index_of(&geo.b_batch, bidx);
        let rows_main = geo.m / GEMM_ROWS * GEMM_ROWS;
        let row_block = |kb: &mut KernelBuilder, m0: Affine, nr: usize| {
            let span = 4 * GEMM_VECTORS;
            let main = if vectorize { geo.n / span * span } else { 0 } as i64;
            let at = GemmAt {
                a0: a0.clone(),
                b0: b0.clone(),
                bidx: bidx.to_vec(),
                m0: m0.clone(),
            };
            kb.for_loop(0, main, span as i64, |kb, q| {
                gemm_tile(
                    kb,
                    &geo,
                    &bufs,
                    &epi,
                    &at,
                    nr,
                    &Affine::var(q),
                    GEMM_VECTORS,
                    Width::F32x4,
                    &out_strides,
                )
            });
            let vec_end = if vectorize {
                main + (geo.n as i64 - main) / 4 * 4
            } else {
                0
            };
            kb.for_loop(main, vec_end, 4, |kb, q| {
                gemm_tile(
                    kb,
                    &geo,
                    &bufs,
                    &epi,
                    &at,
                    nr,
                    &Affine::var(q),
                    1,
                    Width::F32x4,
                    &out_strides,
                )
            });
            kb.for_loop(vec_end, geo.n as i64, 1, |kb, q| {
                gemm_tile(
                    kb,
                    &geo,
                    &bufs,
                    &epi,
                    &at,
                    nr,
                    &Affine::var(q),
                    1,
                    Width::Scalar,
                    &out_strides,
                )
            });
        };
        kb.for_loop(0, rows_main as i64, GEMM_ROWS as i64, |kb, r| {
            row_block(kb, Affine::var(r), GEMM_ROWS)
        });
        kb.for_loop(rows_main as i64, geo.m as i64, 1, |kb, r| {
            row_block(kb, Affine::var(r), 1)
        });
    });
    cx.step(kb.finish(), args)
}

/// Reads operand `k` (0: A, 1: B) of a matmul through `view`: its matrix and batch
/// strides and its offset, from the view's.
fn with_view(geo: &mut GemmGeo, k: usize, view: &view::View) {
    let s = &view.strides;
    let r = s.len();
    let nb = geo.batch.len();
    // the operand's batch dims align with the result's from the right
    let batch = |strides: &[i64]| -> Vec<i64> {
        let own = &strides[..strides.len().saturating_sub(2)];
        (0..nb)
            .map(|d| (d + own.len()).checked_sub(nb).map_or(0, |j| own[j]))
            .collect()
    };
    if k == 0 {
        geo.a_m = s[r - 2];
        geo.a_k = s[r - 1];
        geo.a_batch = batch(s);
        geo.a_offset = view.offset;
    } else {
        geo.b_k = s[r - 2];
        geo.b_n = s[r - 1];
        geo.b_batch = batch(s);
        geo.b_offset = view.offset;
    }
}

/// The packed plan of the plain matmul at instruction `q` by an activation B read
/// through the viewed movement above it, with its epilogue and B's source: attention's
/// `P·V`, planned by the kernel of the product computing its `P` (which reads `P` as it
/// lies, row-major). `None` where the packed path does not take it so.
fn second_product_plan(cx: &Cx, q: usize) -> Option<(packed::PackedGemm, Epilogue, Value)> {
    let inst = &cx.func.insts[q];
    let (a, b) = (inst.operands[0], inst.operands[1]);
    let [at, bt] = [a, b].map(|v| cx.func.type_of(v));
    if at.rank() < 2 || bt.rank() < 2 {
        return None;
    }
    let mut geo = matmul_geo(at, bt, &inst.ty);
    let [a_source, b_source] = read_through_views(cx, &mut geo, [a, b])?;
    if a_source != a {
        return None;
    }
    let epi = Epilogue::new(cx, &[], &[], &inst.ty.dims);
    let (plan, epi) = packed::PackedGemm::plan(cx, &geo, &epi, true)?;
    Some((plan, epi, b_source))
}

/// The values a matmul's operands `[a, b]` are read from, through the viewed movement
/// above them, with `geo` (the matmul's) reading them through those views; `None` when a
/// viewed operand is not a view.
fn read_through_views(cx: &Cx, geo: &mut GemmGeo, operands: [Value; 2]) -> Option<[Value; 2]> {
    let mut sources = operands;
    for (k, source) in sources.iter_mut().enumerate() {
        let view = view::view_of(cx.func, operands[k], &|i| cx.viewed[i])?;
        if view.source != operands[k] {
            with_view(geo, k, &view);
            *source = view.source;
        }
    }
    Some(sources)
}

/// Whether operand `k` of the matmul at instruction `p` may be read through `view`:
/// the packed GEMM takes the product (a micro-kernel target, not the single-row path)
/// and the view's strides (A's columns adjacent; B's columns or rows adjacent, packed
/// at run time).
pub(crate) fn takes_view(
    func: &smelt_ir::graph::Func,
    micro: smelt_ir::loops::TileTarget,
    p: usize,
    k: usize,
    view: &view::View,
) -> bool {
    let inst = &func.insts[p];
    let [a, b] = [inst.operands[0], inst.operands[1]].map(|v| func.type_of(v));
    if a.rank() < 2 || b.rank() < 2 || view.strides.len() < 2 {
        return false;
    }
    let mut geo = matmul_geo(a, b, &inst.ty);
    with_view(&mut geo, k, view);
    let gemv = geo.is_gemv();
    // a constant B (a weight) is packed at compile time, unless it is the viewed one
    let constant_b = k == 0
        && func
            .inst_of(inst.operands[1])
            .is_some_and(|i| matches!(i.op, smelt_ir::op::Op::Const(_)));
    !gemv && packed::PackedGemm::takes(micro, &geo, !constant_b)
}

fn gemm_geo(g: &GemmAttrs, at: &TensorType, out: &TensorType) -> GemmGeo {
    let (m, k) = if g.trans_a {
        (at.dims[1], at.dims[0])
    } else {
        (at.dims[0], at.dims[1])
    };
    let n = out.dims[1];
    let (a_m, a_k) = if g.trans_a {
        (1, m as i64)
    } else {
        (k as i64, 1)
    };
    let (b_k, b_n) = if g.trans_b {
        (1, k as i64)
    } else {
        (n as i64, 1)
    };
    GemmGeo {
        batch: vec![],
        a_batch: vec![],
        b_batch: vec![],
        m,
        n,
        k,
        a_m,
        a_k,
        b_k,
        b_n,
        out_dims: out.dims.clone(),
        has_m: true,
        has_n: true,
        alpha: g.alpha.0,
        beta: g.beta.0,
        a_offset: 0,
        b_offset: 0,
    }
}

fn matmul_geo(at: &TensorType, bt: &TensorType, out: &TensorType) -> GemmGeo {
    let a2 = if at.rank() == 1 {
        vec![1, at.dims[0]]
    } else {
        at.dims.clone()
    };
    let b2 = if bt.rank() == 1 {
        vec![bt.dims[0], 1]
    } else {
        bt.dims.clone()
    };
    let (m, k) = (a2[a2.len() - 2], a2[a2.len() - 1]);
    let n = b2[b2.len() - 1];
    let has_m = at.rank() > 1;
    let has_n = bt.rank() > 1;
    let nb = out.rank() - has_m as usize - has_n as usize;
    let batch = out.dims[..nb].to_vec();
    // broadcast strides of each operand's batch dims against the result's batch dims
    let bstrides = |dims: &[usize]| {
        let batch_dims = &dims[..dims.len() - 2];
        let mat = (dims[dims.len() - 2] * dims[dims.len() - 1]) as i64;
        broadcast_strides(batch_dims, &batch)
            .into_iter()
            .map(|s| s * mat)
            .collect::<Vec<_>>()
    };
    GemmGeo {
        a_batch: bstrides(&a2),
        b_batch: bstrides(&b2),
        batch,
        m,
        n,
        k,
        a_m: k as i64,
        a_k: 1,
        b_k: n as i64,
        b_n: 1,
        out_dims: out.dims.clone(),
        has_m,
        has_n,
        alpha: 1.0,
        beta: 0.0,
        a_offset: 0,
        b_offset: 0,
    }
}

struct GemmBufs {
    a: BufId,
    b: BufId,
    c: Option<(BufId, Vec<i64>)>,
    out: BufId,
}

struct GemmAt {
    a0: Affine,
    b0: Affine,
    bidx: Vec<Affine>,
    m0: Affine,
}

/// A register tile of `nr` rows × `nv` groups of `w.lanes()` columns from column `q0`.
#[allow(clippy::too_many_arguments)]
fn gemm_tile(
    kb: &mut KernelBuilder,
    g: &GemmGeo,
    bufs: &GemmBufs,
    epi: &Epilogue,
    at: &GemmAt,
    nr: usize,
    q0: &Affine,
    nv: usize,
    w: Width,
    out_strides: &[i64],
) {
    let lanes = w.lanes() as i64;
    let accs: Vec<Vec<VarId>> = (0..nr)
        .map(|_| (0..nv).map(|_| kb.var(w)).collect())
        .collect();
    for row in &accs {
        for &acc in row {
            kb.assign(acc, Expr::constant(0.0, w));
        }
    }
    kb.for_loop(0, g.k as i64, 1, |kb, k| {
        let k = Affine::var(k);
        let bs: Vec<Expr> = (0..nv)
            .map(|j| {
                let col = q0.plus(j as i64 * lanes);
                let idx = at.b0.add(&k.scale(g.b_k)).add(&col.scale(g.b_n));
                let v = Expr::load(bufs.b, idx, w);
                if nr > 1 {
                    kb.let_(v, w)
                } else {
                    v
                }
            })
            .collect();
        for (r, row) in accs.iter().enumerate() {
            let m = at.m0.plus(r as i64);
            let ai = at.a0.add(&m.scale(g.a_m)).add(&k.scale(g.a_k));
            let av = Expr::splat_to(Expr::load(bufs.a, ai, Width::Scalar), w);
            let av = if nv > 1 { kb.let_(av, w) } else { av };
            for (j, &acc) in row.iter().enumerate() {
                kb.assign(acc, Expr::fma(av.clone(), bs[j].clone(), Expr::Var(acc)));
            }
        }
    });
    for (r, row) in accs.iter().enumerate() {
        for (j, &acc) in row.iter().enumerate() {
            let m = at.m0.plus(r as i64);
            let col = q0.plus(j as i64 * lanes);
            let mut v = Expr::Var(acc);
            if g.alpha != 1.0 {
                v = Expr::binary(BinOp::Mul, v, Expr::constant(g.alpha, w));
            }
            if let Some((c, strides)) = &bufs.c {
                if g.beta != 0.0 {
                    let cv = load_lanes(
                        *c,
                        index_of(strides, &[m.clone(), col.clone()]),
                        strides[1],
                        w,
                    );
                    v = Expr::fma(cv, Expr::constant(g.beta, w), v);
                }
            }
            let mut idx = at.bidx.clone();
            if g.has_m {
                idx.push(m.clone());
            }
            if g.has_n {
                idx.push(col.clone());
            }
            let v = epi.apply(kb, v, &idx, w);
            kb.store(bufs.out, index_of(out_strides, &idx), v, w);
        }
    }
}

/// `out[n] = α · Σ_k A[k] · B[n·b_n + k] (+ β · C[n])` for one row of A: `R` outputs (8,
/// else 4, 2 or 1, whatever divides them) per trip of the (parallel) loop, one f32x4
/// accumulator each over k (`R` independent FMA chains), reduced once. A stays in L1; B
/// streams once, `R` rows at a time: one 8 KB row at a time left the memory system idle
/// between rows (ResNet-50's classifier, 8 MB: 0.98–1.35 ms one row at a time, 0.76–0.98
/// four, 0.70–0.81 eight).
fn gemv_kernel(
    kb: &mut KernelBuilder,
    g: &GemmGeo,
    bufs: &GemmBufs,
    epi: &Epilogue,
    out_strides: &[i64],
) {
    let w4 = Width::F32x4;
    let rows = [8, 4, 2, 1]
        .into_iter()
        .find(|r| g.n.is_multiple_of(*r))
        .unwrap_or(1);
    let main = (g.k / 4 * 4) as i64;
    kb.set_parallel();
    kb.for_loop(0, (g.n / rows) as i64, 1, |kb, t| {
        let n0 = Affine::var(t).scale(rows as i64);
        let accs: Vec<VarId> = (0..rows).map(|_| kb.var(w4)).collect();
        for &acc in &accs {
            kb.assign(acc, Expr::constant(0.0, w4));
        }
        kb.for_loop(0, main, 4, |kb, k| {
            let k = Affine::var(k);
            let a = kb.let_(Expr::load(bufs.a, k.scale(g.a_k), w4), w4);
            for (r, &acc) in accs.iter().enumerate() {
                let b = Expr::load(bufs.b, n0.plus(r as i64).scale(g.b_n).add(&k), w4);
                kb.assign(acc, Expr::fma(a.clone(), b, Expr::Var(acc)));
            }
        });
        for (r, &acc) in accs.iter().enumerate() {
            let n = n0.plus(r as i64);
            let row = n.scale(g.b_n);
            let total = kb.var(Width::Scalar);
            kb.assign(total, Expr::Reduce(ReduceOp::Add, Box::new(Expr::Var(acc))));
            kb.for_loop(main, g.k as i64, 1, |kb, k| {
                let k = Affine::var(k);
                let a = Expr::load(bufs.a, k.scale(g.a_k), Width::Scalar);
                let b = Expr::load(bufs.b, row.add(&k), Width::Scalar);
                kb.assign(total, Expr::fma(a, b, Expr::Var(total)));
            });
            let s1 = Width::Scalar;
            let mut v = Expr::Var(total);
            if g.alpha != 1.0 {
                v = Expr::binary(BinOp::Mul, v, Expr::constant(g.alpha, s1));
            }
            let m = Affine::constant(0);
            if let Some((c, strides)) = &bufs.c {
                if g.beta != 0.0 {
                    let cv = Expr::load(*c, index_of(strides, &[m.clone(), n.clone()]), s1);
                    v = Expr::fma(cv, Expr::constant(g.beta, s1), v);
                }
            }
            let mut idx = Vec::new();
            if g.has_m {
                idx.push(m);
            }
            if g.has_n {
                idx.push(n);
            }
            let v = epi.apply(kb, v, &idx, s1);
            kb.store(bufs.out, index_of(out_strides, &idx), v, s1);
        }
    });
}
